//! `fencing-gateway migrate`.

use fencing_schema::MigrationReport;

use crate::Error;
use crate::tls::Database;

/// Connects to `database_url` (TLS as its `sslmode` says) and applies the pending migrations.
pub async fn run(database_url: &str) -> Result<MigrationReport, Error> {
    let database = Database::parse(database_url).map_err(Error::Setup)?;
    let mut client = database.connect().await.map_err(Error::Connect)?;
    Ok(fencing_schema::migrate(&mut client).await?)
}
