//! A page's complete history read from the database itself (the gateway's
//! `/history` stops at 10 000 entries), and the token arithmetic over it.

use sqlx::{Connection, PgConnection};

/// One row of `page_history`, as the checker needs it.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Attempt {
    /// `page_history.id`: commit order within a page.
    pub seq: i64,
    pub page_id: String,
    pub method: String,
    pub outcome: String,
    pub token: Option<i64>,
    pub client_id: Option<String>,
    /// The page's version after the attempt.
    pub version: i64,
}

impl Attempt {
    pub fn accepted(&self) -> bool {
        self.outcome == "accepted" || self.outcome == "stale"
    }
}

/// Every attempt on `pages` (all pages when empty), oldest first.
pub async fn load(database_url: &str, pages: &[String]) -> anyhow::Result<Vec<Attempt>> {
    let mut conn = connect(database_url).await?;
    let rows = sqlx::query_as::<_, Attempt>(
        "select id as seq, page_id, method, outcome, token, client_id, version
         from page_history
         where cardinality($1::text[]) = 0 or page_id = any($1)
         order by id",
    )
    .bind(pages)
    .fetch_all(&mut conn)
    .await?;
    let _ = conn.close().await;
    Ok(rows)
}

/// `(fence token, highest history id)` of one page now.
pub async fn fence_and_seq(database_url: &str, page: &str) -> anyhow::Result<(Option<i64>, i64)> {
    let mut conn = connect(database_url).await?;
    let row: (Option<i64>, i64) = sqlx::query_as(
        "select (select fence_token from pages where id = $1),
                coalesce((select max(id) from page_history where page_id = $1), 0)",
    )
    .bind(page)
    .fetch_one(&mut conn)
    .await?;
    let _ = conn.close().await;
    Ok(row)
}

/// `(body, version, fence token)` of one page, if it has a row.
pub async fn page_state(
    database_url: &str,
    page: &str,
) -> anyhow::Result<Option<(Option<String>, i64, Option<i64>)>> {
    let mut conn = connect(database_url).await?;
    let row = sqlx::query_as("select body, version, fence_token from pages where id = $1")
        .bind(page)
        .fetch_optional(&mut conn)
        .await?;
    let _ = conn.close().await;
    Ok(row)
}

/// The database of a PostgreSQL URL (single- or multi-host).
pub fn database_name(url: &str) -> anyhow::Result<String> {
    url.rsplit('/')
        .next()
        .and_then(|s| s.split('?').next())
        .filter(|name| !name.is_empty())
        .map(str::to_string)
        .ok_or_else(|| anyhow::anyhow!("no database name in {url}"))
}

/// A single-host URL for sqlx: the multi-host form is the gateway's own.
async fn connect(database_url: &str) -> anyhow::Result<PgConnection> {
    Ok(PgConnection::connect(database_url).await?)
}

/// Accepted writes whose token is below the fence the storage had already
/// acknowledged. Walks one page's attempts in commit order keeping the
/// highest accepted token (fenced reads raise the fence too); from the first
/// attempt after `floor.0` on, the fence is at least `floor.1`: the highest
/// token acknowledged to a client before a failover, which the surviving
/// history may no longer show.
pub fn stale_writes_accepted(attempts: &[Attempt], floor: Option<(i64, u64)>) -> u64 {
    let mut highest: i64 = i64::MIN;
    let mut floored = false;
    let mut count = 0;
    for a in attempts {
        if let Some((after_seq, token)) = floor {
            if !floored && a.seq > after_seq {
                highest = highest.max(token as i64);
                floored = true;
            }
        }
        let (true, Some(t)) = (a.accepted(), a.token) else {
            continue;
        };
        if a.method == "PUT" && t < highest {
            count += 1;
        }
        highest = highest.max(t);
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(seq: i64, method: &str, outcome: &str, token: i64) -> Attempt {
        Attempt {
            seq,
            page_id: "p".into(),
            method: method.into(),
            outcome: outcome.into(),
            token: Some(token),
            client_id: None,
            version: 0,
        }
    }

    #[test]
    fn a_write_below_an_earlier_accepted_token_is_stale() {
        let h = vec![
            a(1, "GET", "accepted", 5),
            a(2, "PUT", "accepted", 5),
            a(3, "GET", "accepted", 7),
            a(4, "PUT", "stale", 6),
            a(5, "PUT", "stale_token", 4),
        ];
        assert_eq!(stale_writes_accepted(&h, None), 1);
    }

    #[test]
    fn tokens_acknowledged_before_a_failover_count_even_when_the_history_lost_them() {
        // Token 9 was acknowledged by the old primary and never replicated;
        // the new primary's history ends at seq 2, then accepts token 5.
        let h = vec![
            a(1, "GET", "accepted", 5),
            a(2, "GET", "accepted", 5),
            a(3, "PUT", "accepted", 5),
        ];
        assert_eq!(stale_writes_accepted(&h, None), 0);
        assert_eq!(stale_writes_accepted(&h, Some((2, 9))), 1);
        assert_eq!(stale_writes_accepted(&h, Some((2, 5))), 0);
    }
}
