//! `cargo run --release -p bench -- <what>`: the command line, then the
//! benchmark it names (everything else is in the library).

use clap::Parser;

fn main() -> anyhow::Result<()> {
    bench::run(bench::Cli::parse())
}
