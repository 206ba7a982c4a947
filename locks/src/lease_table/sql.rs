//! The statements' text: SQL files (`postgres/sql/`, `mysql/sql/`) with
//! named placeholders, `{table}` for the table's name and `{part}` for a
//! piece of SQL that several statements share, filled here and nowhere else.

/// `template` with each `{name}` of `parts` replaced by its text, in the
/// order given (a part may bring placeholders that a later one fills).
/// `{table}` and unknown placeholders are left for [`statement`].
pub(super) fn fill(template: &str, parts: &[(&str, &str)]) -> String {
    let mut sql = template.trim_end().to_string();
    for (name, text) in parts {
        let placeholder = format!("{{{name}}}");
        assert!(
            sql.contains(&placeholder),
            "no {placeholder} in the template:\n{sql}"
        );
        sql = sql.replace(&placeholder, text.trim_end());
    }
    sql
}

/// The statement of `template` for table `table`: [`fill`], then `{table}`.
/// Panics when a placeholder is left (a part nobody filled): the
/// constructors build every statement, so a test of either catches it.
pub(super) fn statement(template: &str, table: &str, parts: &[(&str, &str)]) -> String {
    let sql = fill(template, parts).replace("{table}", table);
    if let Some(left) = placeholder_in(&sql) {
        panic!("placeholder {{{left}}} left unfilled in:\n{sql}");
    }
    sql
}

/// One function of a lease table, `<table>_<verb>(<params>)`, answering
/// `returns`, whose body is `body` (with `{table}` still unfilled).
pub(super) struct Function {
    pub(super) verb: &'static str,
    pub(super) params: &'static str,
    pub(super) returns: &'static str,
    pub(super) body: String,
}

impl Function {
    pub(super) fn new(
        verb: &'static str,
        params: &'static str,
        returns: &'static str,
        body: String,
    ) -> Function {
        Function {
            verb,
            params,
            returns,
            body,
        }
    }

    /// Its `create or replace function` for table `table`, from `template`
    /// (each database's, with `{verb}`, `{params}`, `{returns}` and
    /// `{body}`) and its `more` parts.
    pub(super) fn create(&self, template: &str, table: &str, more: &[(&str, &str)]) -> String {
        let mut parts = vec![
            ("verb", self.verb),
            ("params", self.params),
            ("returns", self.returns),
            ("body", self.body.as_str()),
        ];
        parts.extend_from_slice(more);
        statement(template, table, &parts)
    }
}

/// A digest of `parts` (FNV-1a, 64 bits, in hex): the same text gives the
/// same digest on every build, which a version check needs.
pub(super) fn digest(parts: &[String]) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in parts.iter().flat_map(|p| p.bytes().chain([0])) {
        hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("{hash:016x}")
}

/// The first `{name}` (lower case letters and `_`) in `sql`. A regular
/// expression's `{16}` is not one.
fn placeholder_in(sql: &str) -> Option<&str> {
    sql.match_indices('{').find_map(|(at, _)| {
        let rest = &sql[at + 1..];
        let end = rest.find('}')?;
        let name = &rest[..end];
        (!name.is_empty() && name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'))
            .then_some(name)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_then_the_table_fill_every_placeholder() {
        let inner = fill("select {what} from {table}", &[("what", "name")]);
        assert_eq!(
            statement("{inner} where x ~ '^a{16}'", "t", &[("inner", &inner)]),
            "select name from t where x ~ '^a{16}'"
        );
    }

    #[test]
    fn the_digest_is_fnv1a() {
        assert_eq!(digest(&["a".into()]), "089be207b544f1e4");
        assert_ne!(digest(&["ab".into()]), digest(&["a".into(), "b".into()]));
    }

    #[test]
    #[should_panic(expected = "placeholder {what} left unfilled")]
    fn a_placeholder_left_unfilled_is_refused() {
        statement("select {what} from {table}", "t", &[]);
    }
}
