//! The invariant check behind `history-service verify`: every inbox marker has its history row,
//! and every history row its marker.

use tokio_postgres::Client;

use super::pool::StoreError;

/// What `verify` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyReport {
    pub inbox_markers: i64,
    pub history_rows: i64,
    /// Markers without a history row: events lost (the marker says "done", nothing was kept).
    pub markers_without_row: Vec<String>,
    pub markers_without_row_total: i64,
    /// History rows without a marker: possible only if the foreign key was removed.
    pub rows_without_marker: Vec<String>,
    pub rows_without_marker_total: i64,
}

impl VerifyReport {
    pub fn is_consistent(&self) -> bool {
        self.markers_without_row_total == 0 && self.rows_without_marker_total == 0
    }
}

/// Checks the invariants; lists at most `limit` offending `event_id`s of each kind.
pub async fn verify(client: &Client, limit: i64) -> Result<VerifyReport, StoreError> {
    let counts = client
        .query_one(
            "SELECT (SELECT count(*) FROM inbox), (SELECT count(*) FROM history_events)",
            &[],
        )
        .await?;
    let (markers_without_row, markers_without_row_total) = offenders(
        client,
        "FROM inbox i WHERE NOT EXISTS \
         (SELECT 1 FROM history_events h WHERE h.event_id = i.event_id)",
        "i.event_id",
        limit,
    )
    .await?;
    let (rows_without_marker, rows_without_marker_total) = offenders(
        client,
        "FROM history_events h WHERE NOT EXISTS \
         (SELECT 1 FROM inbox i WHERE i.event_id = h.event_id)",
        "h.event_id",
        limit,
    )
    .await?;
    Ok(VerifyReport {
        inbox_markers: counts.get(0),
        history_rows: counts.get(1),
        markers_without_row,
        markers_without_row_total,
        rows_without_marker,
        rows_without_marker_total,
    })
}

async fn offenders(
    client: &Client,
    from_where: &str,
    column: &str,
    limit: i64,
) -> Result<(Vec<String>, i64), StoreError> {
    let total: i64 = client
        .query_one(&format!("SELECT count(*) {from_where}"), &[])
        .await?
        .get(0);
    if total == 0 {
        return Ok((Vec::new(), 0));
    }
    let ids = client
        .query(
            &format!("SELECT {column} {from_where} ORDER BY {column} LIMIT $1"),
            &[&limit],
        )
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect();
    Ok((ids, total))
}
