//! `cargo xtask plan --bless`: rewrites the golden printed plans under `tests/golden/plans/`.

use solder_tests::GOLDEN_PLANS;

pub fn bless() -> Result<(), String> {
    for golden in GOLDEN_PLANS {
        let text = golden.render()?;
        let path = golden.path();
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        let old = std::fs::read_to_string(&path).ok();
        if old.as_deref() == Some(text.as_str()) {
            println!("unchanged {}", path.display());
            continue;
        }
        // Write beside, then rename: a failed bless never leaves a half-written golden.
        let tmp = path.with_extension("txt.tmp");
        std::fs::write(&tmp, &text).map_err(|e| format!("{}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, &path).map_err(|e| format!("{}: {e}", path.display()))?;
        println!(
            "{} {}",
            if old.is_some() { "rewrote" } else { "wrote" },
            path.display()
        );
    }
    Ok(())
}
