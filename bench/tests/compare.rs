//! `bench compare --quick` really runs: real services, real figures, and a
//! part that is not measured says so instead of showing a number.

use std::process::Command;

#[test]
fn quick_compare_measures_redis_and_marks_skipped_parts_not_measured() {
    let out = tempfile::tempdir().expect("temp dir");
    let run = Command::new(env!("CARGO_BIN_EXE_bench"))
        .args(["compare", "--quick", "--backend", "redis"])
        .args(["--skip", "limits", "--skip", "peers", "--skip", "chaos"])
        .arg("--out")
        .arg(out.path())
        .output()
        .expect("run bench compare");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "bench compare failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );

    let md = std::fs::read_to_string(out.path().join("COMPARISON.md")).expect("COMPARISON.md");
    let row = md
        .lines()
        .find(|l| l.starts_with("| Redis | ") && !l.contains("limit"))
        .unwrap_or_else(|| panic!("no Redis speed row in:\n{md}"));
    let cells: Vec<&str> = row.split('|').map(str::trim).collect();
    // | Redis | uncontended | p50 | p99 | contended | p50 | p99 | end to end |
    for (i, what) in [(2, "uncontended"), (5, "contended"), (8, "end to end")] {
        let rate: f64 = cells[i]
            .parse()
            .unwrap_or_else(|_| panic!("{what} is not a number in {row}"));
        assert!(rate > 0.0, "{what} rate {rate} in {row}");
    }
    // Fair beside non-fair, and the hot page, both variants.
    let fairness = md
        .lines()
        .find(|l| l.starts_with("| Redis | ") && l.ends_with("× |") && !l.contains("fair"))
        .unwrap_or_else(|| panic!("no fair-beside-non-fair row in:\n{md}"));
    let cells: Vec<&str> = fairness.split('|').map(str::trim).collect();
    for i in [2, 4] {
        let rate: f64 = cells[i]
            .parse()
            .unwrap_or_else(|_| panic!("cell {i} is not a number in {fairness}"));
        assert!(rate > 0.0, "{fairness}");
    }
    for variant in ["fair", "non-fair"] {
        let row = md
            .lines()
            .find(|l| l.starts_with(&format!("| Redis | {variant} | ")))
            .unwrap_or_else(|| panic!("no hot-page row for {variant} in:\n{md}"));
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        // | Redis | variant | 1 worker | 3 workers | ratio | ceiling | shares | smallest | p50 |
        //   p99 | extra | targets |
        for i in [3, 4, 9] {
            let v: f64 = cells[i]
                .parse()
                .unwrap_or_else(|_| panic!("cell {i} is not a number in {row}"));
            assert!(v > 0.0, "{row}");
        }
        // The ceiling (three taking turns in-process) was measured.
        let ceiling: f64 = cells[6]
            .trim_end_matches('×')
            .parse()
            .unwrap_or_else(|_| panic!("the ceiling is not a ratio in {row}"));
        assert!(ceiling > 0.0, "{row}");
        assert_eq!(cells[7].split(" / ").count(), 3, "three shares in {row}");
    }
    assert!(
        md.contains("not measured: skipped with --skip limits"),
        "skipped limits must be shown as not measured:\n{md}"
    );
    assert!(md.contains("Chaos: not measured (skipped with --skip chaos)"));
    assert!(md.contains("`nproc`"), "the machine is stated");
    // The terminal gets the same table.
    assert!(
        stdout.contains(row),
        "stdout lacks the row {row}:\n{stdout}"
    );

    let svg = std::fs::read_to_string(out.path().join("comparison.svg")).expect("svg");
    assert!(svg.starts_with("<svg") && svg.contains("Redis"), "{svg}");
}
