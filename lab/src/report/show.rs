//! Values that show themselves in an evcxr notebook. evcxr calls `evcxr_display` on a cell's
//! value; it prints one block, `EVCXR_BEGIN_CONTENT <mime>` ... `EVCXR_END_CONTENT`, which the
//! notebook renders as that MIME type (polars alone would print plain text).

use polars::prelude::{AnyValue, DataFrame};

// Debug as well: where a cell fails to compile, evcxr retries with Debug and reports that error.

/// A DataFrame as an HTML table: the first [`Table::MAX_ROWS`] rows, then how many were left out.
#[derive(Debug)]
pub struct Table(pub DataFrame);

/// An SVG figure, such as those of [`crate::report::charts`], drawn inline.
#[derive(Debug)]
pub struct Svg(pub String);

/// Markdown written from data (a finding with its figures), rendered as prose.
#[derive(Debug)]
pub struct Markdown(pub String);

fn show(mime: &str, body: &str) {
    println!("EVCXR_BEGIN_CONTENT {mime}\n{body}\nEVCXR_END_CONTENT");
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// Four significant digits, no exponent between 1e-4 and 1e9; integers as integers.
fn number(v: f64) -> String {
    if v == v.trunc() && v.abs() < 1e15 {
        format!("{v:.0}")
    } else if v.abs() >= 1e-4 && v.abs() < 1e9 {
        let decimals = (3 - v.abs().log10().floor() as i32).max(0) as usize;
        format!("{v:.decimals$}")
    } else {
        format!("{v:.3e}")
    }
}

fn cell(v: &AnyValue) -> String {
    match v {
        AnyValue::Null => String::new(),
        AnyValue::String(s) => s.to_string(),
        AnyValue::StringOwned(s) => s.to_string(),
        AnyValue::Float64(x) => number(*x),
        AnyValue::Float32(x) => number(*x as f64),
        other => other.to_string(),
    }
}

impl Table {
    pub const MAX_ROWS: usize = 40;

    pub fn html(&self) -> String {
        let df = &self.0;
        let mut out = String::from("<table>\n<thead><tr>");
        for c in df.columns() {
            out += &format!("<th>{}</th>", escape(c.name()));
        }
        out += "</tr></thead>\n<tbody>\n";
        for i in 0..df.height().min(Self::MAX_ROWS) {
            out += "<tr>";
            for c in df.columns() {
                let v = c.get(i).map(|v| cell(&v)).unwrap_or_default();
                out += &format!("<td>{}</td>", escape(&v));
            }
            out += "</tr>\n";
        }
        out += "</tbody>\n</table>";
        if df.height() > Self::MAX_ROWS {
            out += &format!("\n<p>{} rows, {} shown</p>", df.height(), Self::MAX_ROWS);
        }
        out
    }

    pub fn evcxr_display(&self) {
        show("text/html", &self.html());
    }
}

impl Svg {
    pub fn evcxr_display(&self) {
        show("image/svg+xml", &self.0);
    }
}

impl Markdown {
    pub fn evcxr_display(&self) {
        show("text/markdown", &self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use polars::prelude::*;

    #[test]
    fn a_table_escapes_cells_and_rounds_numbers() {
        let df = DataFrame::new(
            2,
            vec![Column::new("name".into(), ["a<b", "c"]), Column::new("x".into(), [Some(1.234567), None])],
        )
        .unwrap();
        let html = Table(df).html();
        assert!(html.contains("<th>name</th><th>x</th>"), "{html}");
        assert!(html.contains("<td>a&lt;b</td><td>1.235</td>"), "{html}");
        assert!(html.contains("<td>c</td><td></td>"), "{html}");
    }

    #[test]
    fn numbers_keep_four_significant_digits() {
        assert_eq!(number(3.0), "3");
        assert_eq!(number(0.012346), "0.01235");
        assert_eq!(number(2532.44), "2532");
        assert_eq!(number(1.5e-7), "1.500e-7");
    }
}
