//! Writing result tables (the simulator's per-job and per-round records) as Parquet and CSV
//! with polars, for notebooks and spreadsheets; or, for tables too large to hold, as CSV one row
//! at a time ([`CsvRowWriter`]).

use std::path::{Path, PathBuf};

use polars::prelude::*;

use crate::DatasetError;

/// One column of a table to write.
pub enum Values {
    F64(Vec<Option<f64>>),
    U64(Vec<u64>),
    Text(Vec<String>),
}

/// One cell of a row.
#[derive(Clone, Debug, PartialEq)]
pub enum Cell {
    F64(Option<f64>),
    U64(u64),
    Text(String),
}

/// The columns `names` of `rows` (each of `names.len()` cells, of the same kind down a column),
/// for [`write_table`].
pub fn columns<'n>(
    names: &[&'n str],
    rows: impl IntoIterator<Item = Vec<Cell>>,
) -> Vec<(&'n str, Values)> {
    let mut rows = rows.into_iter().peekable();
    let mut out: Vec<(&str, Values)> = match rows.peek() {
        Some(first) => names
            .iter()
            .zip(first)
            .map(|(&n, c)| {
                let v = match c {
                    Cell::F64(_) => Values::F64(Vec::new()),
                    Cell::U64(_) => Values::U64(Vec::new()),
                    Cell::Text(_) => Values::Text(Vec::new()),
                };
                (n, v)
            })
            .collect(),
        None => names
            .iter()
            .map(|&n| (n, Values::Text(Vec::new())))
            .collect(),
    };
    for row in rows {
        assert_eq!(
            row.len(),
            names.len(),
            "a row of {} cells for {} columns",
            row.len(),
            names.len()
        );
        for ((_, column), cell) in out.iter_mut().zip(row) {
            match (column, cell) {
                (Values::F64(v), Cell::F64(x)) => v.push(x),
                (Values::U64(v), Cell::U64(x)) => v.push(x),
                (Values::Text(v), Cell::Text(x)) => v.push(x),
                (_, cell) => panic!("a column of mixed kinds: {cell:?}"),
            }
        }
    }
    out
}

/// A CSV table written one row at a time, in memory that does not grow with it.
#[derive(Debug)]
pub struct CsvRowWriter {
    path: PathBuf,
    writer: csv::Writer<std::io::BufWriter<std::fs::File>>,
    columns: usize,
}

impl CsvRowWriter {
    /// Creates `path` with the header `names`.
    pub fn create(path: &Path, names: &[&str]) -> Result<CsvRowWriter, DatasetError> {
        let file = std::fs::File::create(path).map_err(|source| DatasetError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let mut w = CsvRowWriter {
            path: path.to_path_buf(),
            writer: csv::Writer::from_writer(std::io::BufWriter::new(file)),
            columns: names.len(),
        };
        w.writer.write_record(names).map_err(|e| w.fail(e))?;
        Ok(w)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn fail(&self, e: impl std::fmt::Display) -> DatasetError {
        DatasetError::Write {
            path: self.path.clone(),
            message: e.to_string(),
        }
    }

    /// Appends a row: an empty field for a missing number, numbers in their shortest exact
    /// form, as [`write_table`] writes them (but for exponents of 17 and more: `1e20`, where
    /// it writes `1e+20`).
    pub fn write(&mut self, row: &[Cell]) -> Result<(), DatasetError> {
        assert_eq!(
            row.len(),
            self.columns,
            "a row of {} cells for {} columns",
            row.len(),
            self.columns
        );
        let fields = row.iter().map(|c| match c {
            Cell::F64(Some(x)) => format!("{x:?}"),
            Cell::F64(None) => String::new(),
            Cell::U64(x) => x.to_string(),
            Cell::Text(x) => x.clone(),
        });
        self.writer.write_record(fields).map_err(|e| self.fail(e))
    }

    /// Writes out what is buffered.
    pub fn flush(&mut self) -> Result<(), DatasetError> {
        self.writer.flush().map_err(|e| self.fail(e))
    }
}

/// Writes `columns` to `<stem>.parquet` and `<stem>.csv`; returns both paths.
pub fn write_table(
    stem: &Path,
    columns: Vec<(&str, Values)>,
) -> Result<[PathBuf; 2], DatasetError> {
    let parquet = stem.with_extension("parquet");
    let csv = stem.with_extension("csv");
    let fail = |path: &Path, e: &dyn std::fmt::Display| DatasetError::Write {
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    let cols: Vec<Column> = columns
        .into_iter()
        .map(|(name, v)| match v {
            Values::F64(x) => Column::new(name.into(), x),
            Values::U64(x) => Column::new(name.into(), x),
            Values::Text(x) => Column::new(name.into(), x),
        })
        .collect();
    let mut df = DataFrame::new_infer_height(cols).map_err(|e| fail(&parquet, &e))?;
    let create = |path: &Path| {
        std::fs::File::create(path).map_err(|source| DatasetError::Io {
            path: path.to_path_buf(),
            source,
        })
    };
    ParquetWriter::new(create(&parquet)?)
        .finish(&mut df)
        .map_err(|e| fail(&parquet, &e))?;
    CsvWriter::new(create(&csv)?)
        .finish(&mut df)
        .map_err(|e| fail(&csv, &e))?;
    Ok([parquet, csv])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_become_columns_and_a_table_written_row_by_row_reads_as_one_written_whole() {
        let names = ["name", "jct_s", "restarts"];
        let rows = vec![
            vec![Cell::Text("a".into()), Cell::F64(Some(1.5)), Cell::U64(0)],
            vec![Cell::Text("b".into()), Cell::F64(None), Cell::U64(3)],
            vec![Cell::Text("c".into()), Cell::F64(Some(60.0)), Cell::U64(1)],
            vec![
                Cell::Text("d".into()),
                Cell::F64(Some(1.0e-7)),
                Cell::U64(1),
            ],
            vec![
                Cell::Text("e".into()),
                Cell::F64(Some(123456789012.25)),
                Cell::U64(1),
            ],
        ];
        let dir = tempfile::tempdir().unwrap();
        let [_, whole] =
            write_table(&dir.path().join("whole"), columns(&names, rows.clone())).unwrap();
        let path = dir.path().join("rows.csv");
        let mut w = CsvRowWriter::create(&path, &names).unwrap();
        for r in &rows {
            w.write(r).unwrap();
        }
        w.flush().unwrap();
        assert_eq!(
            std::fs::read_to_string(whole).unwrap(),
            std::fs::read_to_string(&path).unwrap()
        );
        // A place it cannot write: an error with the path.
        let e = CsvRowWriter::create(&dir.path().join("no/such/dir.csv"), &names).unwrap_err();
        assert!(e.to_string().contains("no/such/dir.csv"), "{e}");
    }

    #[test]
    fn tables_are_written_as_parquet_and_csv_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let [parquet, csv] = write_table(
            &dir.path().join("jobs"),
            vec![
                ("name", Values::Text(vec!["a".into(), "b".into()])),
                ("jct_s", Values::F64(vec![Some(1.5), None])),
                ("restarts", Values::U64(vec![0, 3])),
            ],
        )
        .unwrap();
        assert_eq!(
            std::fs::read_to_string(csv).unwrap(),
            "name,jct_s,restarts\na,1.5,0\nb,,3\n"
        );
        let df = ParquetReader::new(std::fs::File::open(parquet).unwrap())
            .finish()
            .unwrap();
        assert_eq!(df.shape(), (2, 3));
        assert_eq!(
            df.column("restarts").unwrap().u64().unwrap().get(1),
            Some(3)
        );
    }
}
