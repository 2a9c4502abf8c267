//! `fencing-gateway migrate`.

use fencing_schema::MigrationReport;
use tokio_postgres::NoTls;
use tracing::warn;

use crate::Error;

/// Connects to `database_url` and applies the pending migrations.
pub async fn run(database_url: &str) -> Result<MigrationReport, Error> {
    let (mut client, connection) = tokio_postgres::connect(database_url, NoTls).await.map_err(Error::Connect)?;
    let connection = tokio::spawn(async move {
        if let Err(error) = connection.await {
            warn!(%error, "database connection ended");
        }
    });
    let report = fencing_schema::migrate(&mut client).await;
    drop(client);
    let _ = connection.await;
    Ok(report?)
}
