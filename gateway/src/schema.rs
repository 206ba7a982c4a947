//! The page database's schema: the migrations in `migrations/postgres`,
//! applied by `gateway setup` as the tables' owner ([`migrate`]), and the
//! serving gateway's read-only check that they were ([`check`]): its own
//! role may not run DDL.

use sqlx::migrate::Migrator;
use sqlx::PgPool;

/// The migrations, embedded.
pub static MIGRATOR: Migrator = sqlx::migrate!("../migrations/postgres");

/// Apply the migrations (idempotent; safe to run from several processes at
/// once, sqlx takes an advisory lock). Needs the owner's rights.
pub async fn migrate(db: &PgPool) -> anyhow::Result<()> {
    accept_reworded(db).await?;
    MIGRATOR.run(db).await.map_err(|e| {
        anyhow::anyhow!(
            "run migrations: {e} (run `gateway setup` with the URL of the role that owns the \
             page tables)"
        )
    })
}

/// Migrations whose files changed in their comments only since some
/// databases applied them: the version and the checksum (SHA-384, hex) it
/// was applied with. sqlx checksums the whole file, comments included.
pub const REWORDED: &[(i64, &str)] = &[(
    4,
    "7efa5e80614441e890d1f34949d80578e45374e2bc89f1c51baef945e9a9c53f1dc197c86736e91c836f7618faba5dca",
)];

/// Give a reworded migration's row this build's checksum, so that the
/// migrator does not refuse the database for a comment.
async fn accept_reworded(db: &PgPool) -> anyhow::Result<()> {
    for (version, old) in REWORDED {
        let Some(m) = MIGRATOR.iter().find(|m| m.version == *version) else {
            continue;
        };
        let updated = sqlx::query(
            "update _sqlx_migrations set checksum = $1 where version = $2 and checksum = decode($3, 'hex')",
        )
        .bind(&*m.checksum)
        .bind(version)
        .bind(old)
        .execute(db)
        .await;
        match updated {
            Ok(_) => {}
            // No migration applied yet: nothing to accept.
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42P01") => return Ok(()),
            Err(e) => anyhow::bail!("accept reworded migration {version}: {e}"),
        }
    }
    Ok(())
}

/// What [`check`] found wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    /// No migration was ever applied here.
    #[error("the page database has no schema yet: run `gateway setup` with the owner's URL first")]
    Empty,
    /// The gateway's role may not read the migrations' table.
    #[error(
        "the gateway's database role cannot read _sqlx_migrations ({0}): run `gateway setup` \
         with the owner's URL (it grants what the gateway needs)"
    )]
    NotReadable(String),
    /// An older schema, or another one.
    #[error(
        "the page database's schema is not this gateway's: {0}. Run `gateway setup` (this \
         version) with the owner's URL"
    )]
    Mismatch(String),
    /// The database could not be asked.
    #[error("cannot read the schema's version: {0}")]
    Unavailable(String),
}

/// Check, reading only, that every migration of this build was applied,
/// unchanged: what the serving gateway does at start instead of migrating.
pub async fn check(db: &PgPool) -> Result<(), SchemaError> {
    let applied: Vec<(i64, Vec<u8>)> = match sqlx::query_as(
        "select version, checksum from _sqlx_migrations where success order by version",
    )
    .fetch_all(db)
    .await
    {
        Ok(rows) => rows,
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42P01") => {
            return Err(SchemaError::Empty)
        }
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42501") => {
            return Err(SchemaError::NotReadable(e.message().to_owned()))
        }
        Err(e) => return Err(SchemaError::Unavailable(e.to_string())),
    };
    let mut missing = Vec::new();
    for m in MIGRATOR
        .iter()
        .filter(|m| m.migration_type.is_up_migration())
    {
        match applied.iter().find(|(v, _)| *v == m.version) {
            None => missing.push(format!("{} ({})", m.version, m.description)),
            Some((_, checksum)) if checksum.as_slice() != &*m.checksum => {
                return Err(SchemaError::Mismatch(format!(
                    "migration {} ({}) was applied with other contents",
                    m.version, m.description
                )))
            }
            Some(_) => {}
        }
    }
    if applied.is_empty() {
        return Err(SchemaError::Empty);
    }
    if !missing.is_empty() {
        return Err(SchemaError::Mismatch(format!(
            "migrations not applied: {}",
            missing.join(", ")
        )));
    }
    Ok(())
}
