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
    #[should_panic(expected = "placeholder {what} left unfilled")]
    fn a_placeholder_left_unfilled_is_refused() {
        statement("select {what} from {table}", "t", &[]);
    }
}
