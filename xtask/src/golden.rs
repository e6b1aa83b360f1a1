//! `cargo xtask plan --bless`: rewrites the golden printed plans under `tests/golden/plans/`
//! and their `RULES_DIGEST`.

use solder_tests::golden_files;

pub fn bless() -> Result<(), String> {
    for (path, text) in golden_files() {
        let text = text?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        let old = std::fs::read_to_string(&path).ok();
        if old.as_deref() == Some(text.as_str()) {
            println!("unchanged {}", path.display());
            continue;
        }
        // Through an exclusive temporary, then renamed: never half a golden, never a link.
        crate::files::write_output(&path, text.as_bytes(), &crate::files::Inputs::default())?;
        println!(
            "{} {}",
            if old.is_some() { "rewrote" } else { "wrote" },
            path.display()
        );
    }
    Ok(())
}
