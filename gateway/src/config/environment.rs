//! Environment overrides: `FENCING_<SECTION>_<KEY>` sets `<section>.<key>`, `DATABASE_URL`
//! (and `FENCING_DATABASE_URL`, which wins) sets `database.url`, and a secret may come from a
//! file (`DATABASE_URL_FILE`). Tests pass a map instead of the process environment.

use std::collections::BTreeMap;

/// Where environment overrides come from: the process environment, or a map in tests.
pub trait Environment {
    /// Every variable, name and value.
    fn vars(&self) -> Vec<(String, String)>;
}

/// The process environment.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessEnvironment;

impl Environment for ProcessEnvironment {
    fn vars(&self) -> Vec<(String, String)> {
        std::env::vars_os()
            .filter_map(|(name, value)| Some((name.into_string().ok()?, value.into_string().ok()?)))
            .collect()
    }
}

impl Environment for BTreeMap<String, String> {
    fn vars(&self) -> Vec<(String, String)> {
        self.iter().map(|(name, value)| (name.clone(), value.clone())).collect()
    }
}

/// The environment variables that override a key, and the key: `FENCING_<SECTION>_<KEY>`,
/// plus `DATABASE_URL` for `database.url`.
const SECTIONS: [&str; 5] = ["proxy", "control", "database", "upstream", "shutdown"];

pub(super) fn apply_environment(table: &mut toml::Table, env: &dyn Environment) -> Result<(), Vec<String>> {
    // (priority, section, key, value): FENCING_DATABASE_URL wins over DATABASE_URL. A secret
    // may come from a file instead: `DATABASE_URL_FILE`, `FENCING_DATABASE_URL_FILE`.
    let mut overrides: Vec<(u8, String, String, String)> = Vec::new();
    let mut problems = Vec::new();
    let vars = env.vars();
    for (name, value) in &vars {
        let priority = match name.as_str() {
            "DATABASE_URL_FILE" => 0,
            "FENCING_DATABASE_URL_FILE" => 1,
            _ => continue,
        };
        let plain = name.trim_end_matches("_FILE");
        if vars.iter().any(|(other, _)| other == plain) {
            problems.push(format!("{name}: set {plain} or {name}, not both"));
            continue;
        }
        match std::fs::read_to_string(value) {
            Ok(text) => overrides.push((priority, "database".to_owned(), "url".to_owned(), text.trim().to_owned())),
            Err(error) => problems.push(format!("{name}: {value}: {error}")),
        }
    }
    for (name, value) in vars {
        if name == "DATABASE_URL" {
            overrides.push((0, "database".to_owned(), "url".to_owned(), value));
            continue;
        }
        if name.ends_with("_FILE") {
            continue;
        }
        let Some(rest) = name.strip_prefix("FENCING_") else {
            continue;
        };
        let rest = rest.to_ascii_lowercase();
        for section in SECTIONS {
            if let Some(key) = rest.strip_prefix(section).and_then(|k| k.strip_prefix('_')) {
                overrides.push((1, section.to_owned(), key.to_owned(), value.clone()));
            }
        }
    }
    overrides.sort_by_key(|(priority, ..)| *priority);
    for (_, section, key, value) in overrides {
        let entry = table.entry(section).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if let toml::Value::Table(section) = entry {
            let typed = match (value.parse::<i64>(), value.as_str()) {
                (Ok(number), _) => toml::Value::Integer(number),
                (_, "true") => toml::Value::Boolean(true),
                (_, "false") => toml::Value::Boolean(false),
                _ => toml::Value::String(value),
            };
            section.insert(key, typed);
        }
    }
    if problems.is_empty() { Ok(()) } else { Err(problems) }
}
