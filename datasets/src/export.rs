//! Writing result tables (the simulator's per-job and per-round records) as Parquet and CSV
//! with polars, for notebooks and spreadsheets.

use std::path::{Path, PathBuf};

use polars::prelude::*;

use crate::DatasetError;

/// One column of a table to write.
pub enum Values {
    F64(Vec<Option<f64>>),
    U64(Vec<u64>),
    Text(Vec<String>),
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
