//! Cross-crate tests live in `tests/`; fixtures in `fixtures/`.
