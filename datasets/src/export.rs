//! Writing result tables (the simulator's per-job and per-round records) as Parquet and CSV
//! with polars, for notebooks and spreadsheets; whole ([`write_table`]), or batch by batch for
//! tables too large to hold ([`TableWriter`]: CSV rows appended, Parquet row groups of
//! [`ROW_GROUP_ROWS`]).

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
pub(crate) struct CsvRowWriter {
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

/// Rows of a Parquet row group [`TableWriter`] writes: few enough to hold (a few MB of
/// columns), enough that the file's footer, which lists every row group and stays in memory
/// until the end, grows by little (16 row groups a million rows).
pub const ROW_GROUP_ROWS: usize = 65_536;

/// A table written batch by batch to `<stem>.csv` and `<stem>.parquet`, in memory that
/// follows a row group and not the table (but for the Parquet footer, a few KB a row group):
/// the same files [`write_table`] writes for the same rows.
pub struct TableWriter {
    names: Vec<String>,
    csv: CsvRowWriter,
    parquet_path: PathBuf,
    /// Made with the first batch's schema.
    parquet: Option<polars::io::parquet::write::BatchedWriter<std::fs::File>>,
    /// Rows not yet in a row group.
    pending: Option<DataFrame>,
}

impl TableWriter {
    /// Creates `<stem>.csv` (with its header) and, at the first batch, `<stem>.parquet`.
    pub fn create(stem: &Path, names: &[&str]) -> Result<TableWriter, DatasetError> {
        Ok(TableWriter {
            names: names.iter().map(|n| n.to_string()).collect(),
            csv: CsvRowWriter::create(&stem.with_extension("csv"), names)?,
            parquet_path: stem.with_extension("parquet"),
            parquet: None,
            pending: None,
        })
    }

    fn fail(&self, e: impl std::fmt::Display) -> DatasetError {
        DatasetError::Write {
            path: self.parquet_path.clone(),
            message: e.to_string(),
        }
    }

    /// The Parquet and CSV paths.
    pub fn paths(&self) -> [PathBuf; 2] {
        [self.parquet_path.clone(), self.csv.path().to_path_buf()]
    }

    /// Appends `rows`: CSV lines now, Parquet rows in row groups of [`ROW_GROUP_ROWS`].
    pub fn write_batch(&mut self, rows: Vec<Vec<Cell>>) -> Result<(), DatasetError> {
        if rows.is_empty() {
            return Ok(());
        }
        for r in &rows {
            self.csv.write(r)?;
        }
        let names: Vec<&str> = self.names.iter().map(String::as_str).collect();
        let df = frame(columns(&names, rows)).map_err(|e| self.fail(e))?;
        let pending = match self.pending.take() {
            Some(mut p) => {
                p.vstack_mut(&df).map_err(|e| self.fail(e))?;
                p
            }
            None => df,
        };
        if pending.height() < ROW_GROUP_ROWS {
            self.pending = Some(pending);
            return Ok(());
        }
        self.write_row_group(pending)
    }

    /// Writes `df` as one row group.
    fn write_row_group(&mut self, mut df: DataFrame) -> Result<(), DatasetError> {
        // A row group per chunk: one chunk.
        df.rechunk_mut();
        if self.parquet.is_none() {
            let file =
                std::fs::File::create(&self.parquet_path).map_err(|source| DatasetError::Io {
                    path: self.parquet_path.clone(),
                    source,
                })?;
            let w = ParquetWriter::new(file)
                .batched(df.schema())
                .map_err(|e| self.fail(e))?;
            self.parquet = Some(w);
        }
        let w = self.parquet.as_mut().expect("made above");
        w.write_batch(&df).map_err(|e| DatasetError::Write {
            path: self.parquet_path.clone(),
            message: e.to_string(),
        })
    }

    /// Writes out the rest; returns the Parquet and CSV paths. A table that got no rows is
    /// written whole, its columns as text.
    pub fn finish(mut self) -> Result<[PathBuf; 2], DatasetError> {
        self.csv.flush()?;
        if let Some(df) = self.pending.take() {
            self.write_row_group(df)?;
        }
        let csv = self.csv.path().to_path_buf();
        match &self.parquet {
            Some(w) => {
                w.finish().map_err(|e| self.fail(e))?;
            }
            None => {
                let names: Vec<&str> = self.names.iter().map(String::as_str).collect();
                let mut df = frame(columns(&names, [])).map_err(|e| self.fail(e))?;
                let file = std::fs::File::create(&self.parquet_path).map_err(|source| {
                    DatasetError::Io {
                        path: self.parquet_path.clone(),
                        source,
                    }
                })?;
                ParquetWriter::new(file)
                    .finish(&mut df)
                    .map_err(|e| self.fail(e))?;
            }
        }
        Ok([self.parquet_path.clone(), csv])
    }
}

/// The columns as a polars frame.
fn frame(columns: Vec<(&str, Values)>) -> PolarsResult<DataFrame> {
    let cols: Vec<Column> = columns
        .into_iter()
        .map(|(name, v)| match v {
            Values::F64(x) => Column::new(name.into(), x),
            Values::U64(x) => Column::new(name.into(), x),
            Values::Text(x) => Column::new(name.into(), x),
        })
        .collect();
    DataFrame::new_infer_height(cols)
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
    let mut df = frame(columns).map_err(|e| fail(&parquet, &e))?;
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
        // Batch by batch, both files: the CSV as written whole, the Parquet the same frame.
        let mut t = TableWriter::create(&dir.path().join("batched"), &names).unwrap();
        t.write_batch(rows[..2].to_vec()).unwrap();
        t.write_batch(Vec::new()).unwrap();
        t.write_batch(rows[2..].to_vec()).unwrap();
        let [parquet, csv] = t.finish().unwrap();
        assert_eq!(
            std::fs::read_to_string(csv).unwrap(),
            std::fs::read_to_string(&path).unwrap()
        );
        let read = |p: &Path| {
            ParquetReader::new(std::fs::File::open(p).unwrap())
                .finish()
                .unwrap()
        };
        let batched = read(&parquet);
        assert_eq!(batched.shape(), (rows.len(), 3));
        assert!(batched.equals_missing(&read(&dir.path().join("whole.parquet"))));
        // No rows: still both files, with the header.
        let t = TableWriter::create(&dir.path().join("empty"), &names).unwrap();
        let [parquet, csv] = t.finish().unwrap();
        assert_eq!(
            std::fs::read_to_string(csv).unwrap(),
            "name,jct_s,restarts\n"
        );
        assert_eq!(read(&parquet).shape(), (0, 3));
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

    #[test]
    fn a_table_of_several_row_groups_reads_back_as_written_whole() {
        let names = ["job", "finish_s", "restarts"];
        let rows: Vec<Vec<Cell>> = (0..2 * ROW_GROUP_ROWS + 10)
            .map(|i| {
                vec![
                    Cell::Text(format!("j{i}")),
                    Cell::F64((i % 3 != 0).then_some(i as f64 / 4.0)),
                    Cell::U64(i as u64 % 7),
                ]
            })
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let [whole, whole_csv] =
            write_table(&dir.path().join("whole"), columns(&names, rows.clone())).unwrap();
        let mut t = TableWriter::create(&dir.path().join("batched"), &names).unwrap();
        for batch in rows.chunks(4096) {
            t.write_batch(batch.to_vec()).unwrap();
        }
        let [parquet, csv] = t.finish().unwrap();
        let read = |p: &Path| {
            ParquetReader::new(std::fs::File::open(p).unwrap())
                .finish()
                .unwrap()
        };
        assert!(read(&parquet).equals_missing(&read(&whole)));
        assert_eq!(
            std::fs::read_to_string(csv).unwrap(),
            std::fs::read_to_string(whole_csv).unwrap()
        );
    }
}
