//! The sections of `docs/BENCHMARKS.md` a benchmark rewrites: its own,
//! under its heading, leaving the other sections alone.

use std::path::{Path, PathBuf};

use anyhow::Context;

/// `docs/BENCHMARKS.md` of this checkout.
fn benchmarks_md() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/BENCHMARKS.md")
}

/// Replace the body of the section `heading` (a `## ` line) with `body`,
/// keeping any hand-written notes at its end (from a line starting with
/// `Notes:`). A section not there yet goes after the one whose heading
/// starts with `after`; without `after` it must exist.
pub fn write_section(heading: &str, body: &str, after: Option<&str>) -> anyhow::Result<()> {
    let path = benchmarks_md();
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
    let new = replace_section(&text, heading, body, after)?;
    std::fs::write(&path, new).with_context(|| format!("write {}", path.display()))
}

fn replace_section(
    text: &str,
    heading: &str,
    body: &str,
    after: Option<&str>,
) -> anyhow::Result<String> {
    let body = body.trim_end();
    if let Some(at) = text.find(heading) {
        let start = at + heading.len();
        let end = text[start..]
            .find("\n## ")
            .map_or(text.len(), |i| start + i + 1);
        let old = &text[start..end];
        let notes = old
            .find("\nNotes:")
            .map(|i| old[i..].trim_end().to_owned() + "\n")
            .unwrap_or_default();
        return Ok(format!(
            "{}{heading}\n\n{body}\n{notes}\n{}",
            &text[..at],
            &text[end..]
        ));
    }
    let after = after.with_context(|| format!("no section {heading:?} in docs/BENCHMARKS.md"))?;
    let previous = text
        .find(after)
        .with_context(|| format!("no section {after:?} in docs/BENCHMARKS.md"))?;
    let next = text[previous + 3..]
        .find("\n## ")
        .map_or(text.len(), |i| previous + 3 + i + 1);
    Ok(format!(
        "{}{heading}\n\n{body}\n\n{}",
        &text[..next],
        &text[next..]
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "# B\n\n## One\n\nold\n\nNotes: kept.\n\n## Two\n\ntwo\n";

    #[test]
    fn a_section_is_replaced_and_its_notes_are_kept() {
        let new = replace_section(DOC, "## One", "new\n", None).unwrap();
        assert_eq!(
            new,
            "# B\n\n## One\n\nnew\n\nNotes: kept.\n\n## Two\n\ntwo\n"
        );
    }

    #[test]
    fn a_missing_section_goes_after_the_named_one_or_is_an_error() {
        let new = replace_section(DOC, "## New", "fresh", Some("## One")).unwrap();
        assert_eq!(
            new,
            "# B\n\n## One\n\nold\n\nNotes: kept.\n\n## New\n\nfresh\n\n## Two\n\ntwo\n"
        );
        assert!(replace_section(DOC, "## New", "fresh", None).is_err());
    }
}
