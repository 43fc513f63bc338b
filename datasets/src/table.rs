//! Reading a delimited text table with polars, and typed access to its cells with errors that
//! name the file, line and column.
//!
//! Every column is read as text (no type inference), so a malformed value is reported by the
//! parser of the format that owns the column, with its position, instead of turning the whole
//! column into strings or nulls behind the caller's back.

use std::path::{Path, PathBuf};
use std::str::FromStr;

use polars::prelude::*;

use crate::DatasetError;

/// How a table is laid out on disk.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Layout<'a> {
    /// The header the file must start with, or `None` for a headerless file with exactly
    /// `columns` fields per line.
    pub header: Option<&'a [&'a str]>,
    pub columns: usize,
    pub separator: u8,
    /// The header's columns may come in any order.
    pub any_order: bool,
}

impl<'a> Layout<'a> {
    pub fn csv(header: &'a [&'a str]) -> Self {
        Layout {
            header: Some(header),
            columns: header.len(),
            separator: b',',
            any_order: false,
        }
    }

    pub fn tsv_without_header(columns: usize) -> Self {
        Layout {
            header: None,
            columns,
            separator: b'\t',
            any_order: false,
        }
    }
}

/// A table of text cells; rows count from 0, columns in the order of the layout.
pub(crate) struct Table {
    path: PathBuf,
    columns: Vec<StringChunked>,
    names: Vec<String>,
    /// Line of row 0 in the file (2 after a header).
    first_line: usize,
    rows: usize,
}

impl Table {
    pub fn read(path: &Path, layout: Layout<'_>) -> Result<Table, DatasetError> {
        // polars reports a missing file without its name; check first for a clear message.
        std::fs::metadata(path).map_err(|source| DatasetError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let quote = if layout.separator == b'\t' {
            None
        } else {
            Some(b'"')
        };
        let df = CsvReadOptions::default()
            .with_has_header(layout.header.is_some())
            .with_infer_schema_length(Some(0))
            .with_raise_if_empty(false)
            .map_parse_options(|o| o.with_separator(layout.separator).with_quote_char(quote))
            .try_into_reader_with_file_path(Some(path.to_path_buf()))
            .and_then(|r| r.finish())
            .map_err(|e| DatasetError::format(path, format!("not a readable table: {e}")))?;
        let names: Vec<String> = df
            .get_column_names()
            .iter()
            .map(|n| n.to_string())
            .collect();
        match layout.header {
            Some(header) => {
                let found: Vec<&str> = names.iter().map(String::as_str).collect();
                let same = if layout.any_order {
                    let mut a = found.clone();
                    let mut b = header.to_vec();
                    a.sort_unstable();
                    b.sort_unstable();
                    a == b
                } else {
                    found == header
                };
                if !same {
                    return Err(DatasetError::format(
                        path,
                        format!(
                            "header is `{}`, expected `{}`",
                            found.join(","),
                            header.join(",")
                        ),
                    ));
                }
            }
            None if df.height() > 0 && names.len() != layout.columns => {
                return Err(DatasetError::Value {
                    path: path.to_path_buf(),
                    line: 1,
                    column: names.len().min(layout.columns) + 1,
                    message: format!(
                        "{} fields on the line, expected {}",
                        names.len(),
                        layout.columns
                    ),
                });
            }
            None => {}
        }
        let columns = df
            .columns()
            .iter()
            .map(|c| c.str().cloned())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| DatasetError::format(path, e.to_string()))?;
        // Blank lines at the end of a file read as rows of nulls; they are not rows.
        let mut rows = df.height();
        while rows > 0 && columns.iter().all(|c| c.get(rows - 1).is_none()) {
            rows -= 1;
        }
        Ok(Table {
            path: path.to_path_buf(),
            rows,
            columns,
            names,
            first_line: if layout.header.is_some() { 2 } else { 1 },
        })
    }

    /// A CSV whose header has exactly the columns `header`, in any order.
    pub fn read_any_order(path: &Path, header: &[&str]) -> Result<Table, DatasetError> {
        let mut layout = Layout::csv(header);
        layout.any_order = true;
        Table::read(path, layout)
    }

    /// The index of the column named `name`.
    pub fn column(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|n| n == name)
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The line of the file that holds `row`.
    pub fn line(&self, row: usize) -> usize {
        self.first_line + row
    }

    /// An error about the cell at (`row`, `col`).
    pub fn error(&self, row: usize, col: usize, message: impl Into<String>) -> DatasetError {
        self.at(row).error(col, message.into())
    }

    /// Row `row`, for typed access to its cells.
    pub fn at(&self, row: usize) -> TableRow<'_> {
        TableRow { table: self, row }
    }

    /// The text of a cell; a missing value is an error.
    pub fn text(&self, row: usize, col: usize) -> Result<&str, DatasetError> {
        self.columns[col]
            .get(row)
            .ok_or_else(|| self.error(row, col, format!("{} is missing", label(&self.names, col))))
    }

    /// The text of a cell, `None` when empty.
    pub fn optional_text(&self, row: usize, col: usize) -> Option<&str> {
        self.columns[col]
            .get(row)
            .map(str::trim)
            .filter(|s| !s.is_empty())
    }

    /// A cell parsed as `T` (surrounding spaces ignored).
    pub fn parse<T: FromStr>(&self, row: usize, col: usize) -> Result<T, DatasetError>
    where
        T::Err: std::fmt::Display,
    {
        self.at(row).parse(col)
    }

    /// A finite number, at least `min`.
    pub fn number(&self, row: usize, col: usize, min: f64) -> Result<f64, DatasetError> {
        self.at(row).number(col, min)
    }

    /// A whole number, at least `min`; `3.0` is accepted, `3.5` is not.
    pub fn count(&self, row: usize, col: usize, min: u64) -> Result<u64, DatasetError> {
        self.at(row).count(col, min)
    }
}

/// How an error names column `col` of a table whose columns are `names`.
fn label(names: &[String], col: usize) -> String {
    match names.get(col) {
        Some(n) if !n.starts_with("column_") => format!("`{n}`"),
        _ => format!("field {}", col + 1),
    }
}

/// Typed access to the cells of one row, with errors that name the file, line and column: a
/// row of a [`Table`] or one read by [`CsvRows`].
pub(crate) trait Cells {
    /// The text of cell `col`, `None` if the row has no such cell or it is null.
    fn cell(&self, col: usize) -> Option<&str>;
    /// The file the row is in, and the line it is on.
    fn path(&self) -> &Path;
    fn line(&self) -> usize;
    /// How errors name column `col`.
    fn label(&self, col: usize) -> String;

    /// An error about cell `col`.
    fn error(&self, col: usize, message: String) -> DatasetError {
        DatasetError::Value {
            path: self.path().to_path_buf(),
            line: self.line(),
            column: col + 1,
            message,
        }
    }

    /// The text of a cell; a missing value is an error.
    fn text(&self, col: usize) -> Result<&str, DatasetError> {
        self.cell(col)
            .ok_or_else(|| self.error(col, format!("{} is missing", self.label(col))))
    }

    /// A cell parsed as `T` (surrounding spaces ignored).
    fn parse<T: FromStr>(&self, col: usize) -> Result<T, DatasetError>
    where
        T::Err: std::fmt::Display,
    {
        let text = self.text(col)?;
        text.trim().parse().map_err(|e| {
            self.error(
                col,
                format!("{} `{text}` is not a valid value: {e}", self.label(col)),
            )
        })
    }

    /// A finite number, at least `min`.
    fn number(&self, col: usize, min: f64) -> Result<f64, DatasetError> {
        let v: f64 = self.parse(col)?;
        if !v.is_finite() || v < min {
            return Err(self.error(
                col,
                format!("{} is {v}, expected a number ≥ {min}", self.label(col)),
            ));
        }
        Ok(v)
    }

    /// A whole number, at least `min`; `3.0` is accepted, `3.5` is not.
    fn count(&self, col: usize, min: u64) -> Result<u64, DatasetError> {
        let v = self.number(col, min as f64)?;
        if v.fract() != 0.0 || v > u32::MAX as f64 * 65536.0 {
            return Err(self.error(
                col,
                format!("{} is {v}, expected a whole number", self.label(col)),
            ));
        }
        Ok(v as u64)
    }
}

/// A row of a [`Table`].
pub(crate) struct TableRow<'a> {
    table: &'a Table,
    row: usize,
}

impl Cells for TableRow<'_> {
    fn cell(&self, col: usize) -> Option<&str> {
        self.table.columns[col].get(self.row)
    }

    fn path(&self) -> &Path {
        &self.table.path
    }

    fn line(&self) -> usize {
        self.table.line(self.row)
    }

    fn label(&self, col: usize) -> String {
        label(&self.table.names, col)
    }
}

/// A CSV read one row at a time, in memory that does not grow with the file (the csv crate):
/// for files too large to hold, such as a million-job trace.
pub(crate) struct CsvRows {
    path: PathBuf,
    reader: csv::Reader<std::io::BufReader<std::fs::File>>,
    names: Vec<String>,
    record: csv::StringRecord,
}

impl CsvRows {
    /// Opens a CSV whose header has exactly the columns `header`, in any order.
    pub fn open_any_order(path: &Path, header: &[&str]) -> Result<CsvRows, DatasetError> {
        let file = std::fs::File::open(path).map_err(|source| DatasetError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let mut reader = csv::ReaderBuilder::new()
            .flexible(true)
            .from_reader(std::io::BufReader::new(file));
        let names: Vec<String> = reader
            .headers()
            .map_err(|e| DatasetError::format(path, format!("not a readable table: {e}")))?
            .iter()
            .map(str::to_string)
            .collect();
        let mut found: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut expected = header.to_vec();
        found.sort_unstable();
        expected.sort_unstable();
        if found != expected {
            return Err(DatasetError::format(
                path,
                format!(
                    "header is `{}`, expected `{}`",
                    names.join(","),
                    header.join(",")
                ),
            ));
        }
        Ok(CsvRows {
            path: path.to_path_buf(),
            reader,
            names,
            record: csv::StringRecord::new(),
        })
    }

    /// The index of the column named `name`.
    pub fn column(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|n| n == name)
    }

    /// The next row, `None` at the end of the file.
    pub fn next_row(&mut self) -> Result<Option<CsvRow<'_>>, DatasetError> {
        match self.reader.read_record(&mut self.record) {
            Ok(true) => Ok(Some(CsvRow { rows: self })),
            Ok(false) => Ok(None),
            Err(e) => {
                let line = e.position().map_or(0, |p| p.line() as usize);
                Err(DatasetError::Value {
                    path: self.path.clone(),
                    line,
                    column: 1,
                    message: format!("not a readable row: {e}"),
                })
            }
        }
    }
}

/// The row [`CsvRows`] read last.
pub(crate) struct CsvRow<'a> {
    rows: &'a CsvRows,
}

impl Cells for CsvRow<'_> {
    fn cell(&self, col: usize) -> Option<&str> {
        self.rows.record.get(col)
    }

    fn line(&self) -> usize {
        self.rows.record.position().map_or(0, |p| p.line() as usize)
    }

    fn path(&self) -> &Path {
        &self.rows.path
    }

    fn label(&self, col: usize) -> String {
        label(&self.rows.names, col)
    }
}
