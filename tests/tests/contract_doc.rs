//! Keeps `docs/CONTRACT.md` true: every invariant it states is named by tests, and every problem
//! type the gateway can answer is listed there.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn text_of(dirs: &[&str]) -> String {
    let mut files = Vec::new();
    for dir in dirs {
        rust_files(&root().join(dir), &mut files);
    }
    files.iter().map(|f| std::fs::read_to_string(f).unwrap()).collect::<Vec<_>>().join("\n")
}

#[test]
fn every_invariant_of_the_contract_is_named_by_tests() {
    let contract = std::fs::read_to_string(root().join("docs/CONTRACT.md")).unwrap();
    let tests = text_of(&["tests/tests", "election/tests", "gateway/tests", "schema/tests"]);
    for n in 1..=8 {
        assert!(contract.contains(&format!("- S{n}. ")), "docs/CONTRACT.md does not state S{n}");
        let named = tests.contains(&format!("fn s{n}_"))
            || tests.contains(&format!("_s{n}_"))
            || tests.contains(&format!("/// S{n}"))
            || tests.contains(&format!("S{n}:"));
        assert!(named, "no test names S{n}");
    }
}

#[test]
fn every_problem_type_the_gateway_answers_is_listed_in_the_contract() {
    let contract = std::fs::read_to_string(root().join("docs/CONTRACT.md")).unwrap();
    let source = text_of(&["gateway/src"]);
    let mut kinds = Vec::new();
    // `Problem::new(status, "kind", ...)`, the fence outcomes' kinds, and the canned 503.
    for piece in source.split("Problem::new(").skip(1) {
        // The second argument, when it is a literal.
        let Some((_, rest)) = piece.split_once(',') else { continue };
        if let Some(literal) = rest.trim_start().strip_prefix('"')
            && let Some((kind, _)) = literal.split_once('"')
        {
            kinds.push(kind.to_owned());
        }
    }
    for piece in source.split("urn:fencing-gateway:problem:").skip(1) {
        let kind: String = piece.chars().take_while(|c| c.is_ascii_lowercase() || *c == '-').collect();
        if !kind.is_empty() {
            kinds.push(kind);
        }
    }
    for kind in ["stale-term", "not-leader", "future-term"] {
        assert!(source.contains(&format!("\"{kind}\"")), "{kind} is no longer a problem type");
        kinds.push(kind.to_owned());
    }
    kinds.sort();
    kinds.dedup();
    assert!(kinds.len() > 20, "found only {kinds:?}");
    let listed = contract.split("Problem types").nth(1).unwrap();
    for kind in kinds {
        assert!(listed.contains(&kind), "problem type {kind:?} is not listed in docs/CONTRACT.md");
    }
}
