//! The settings' secrets file. Passwords never reach a message or a log:
//! every URL the gateway is given (its database, its issuers, the setup's)
//! goes through [`fencelock::redact_url`] before it is written anywhere, and
//! every error text that may quote one (a driver's or the lock library's)
//! through [`fencelock::scrub_secrets`]: one definition of a URL's secrets
//! for the library, the gateway and the workers.

/// The settings' secrets file: `--secrets-file FILE` (anywhere on the
/// command line) or `SECRETS_FILE`, read before the real parse.
#[derive(clap::Parser)]
#[command(
    ignore_errors = true,
    disable_help_flag = true,
    disable_version_flag = true
)]
struct SecretsFileArg {
    #[arg(long, env = "SECRETS_FILE")]
    secrets_file: Option<std::path::PathBuf>,
    #[arg(allow_hyphen_values = true, trailing_var_arg = true, hide = true)]
    _rest: Vec<std::ffi::OsString>,
}

/// Load the secrets file (see [`crate::Config::secrets_file`]) into the
/// environment, where clap's env fallbacks find it; variables already set
/// win.
pub fn load_secrets_file() -> Result<(), String> {
    use clap::Parser;
    let Some(path) = SecretsFileArg::parse().secrets_file else {
        return Ok(());
    };
    dotenvy::from_path(&path).map_err(|e| format!("secrets file {}: {e}", path.display()))
}
