//! The comparison as tables (terminal and `COMPARISON.md`) and as an SVG
//! chart.
//!
//! # Layout
//! - `cells.rs`: the rows' names and the cells' formats, shared.
//! - `tables.rs`: the tables: speed, fair and non-fair, hot page, limits
//!   and peers, chaos.
//! - `page.rs`: the terminal's text and `COMPARISON.md` around them.
//! - `chart.rs`: the SVG chart.

mod cells;
mod chart;
mod page;
mod tables;

pub use cells::backend_line;
pub use chart::svg;
pub use page::{markdown, terminal};
