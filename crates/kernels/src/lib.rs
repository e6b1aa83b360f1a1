//! solder's CUDA kernels: the CUDA C sources (`cuda/<module>.cu`, shared device helpers in
//! `cuda/common.cuh`) and the PTX `cargo xtask ptx` generates from them (`ptx/<module>.ptx`),
//! both embedded here by module name so that a binary needs no files and no CUDA toolkit.
//!
//! Invariants: `MODULES` names exactly the files `cuda/<module>.cu` and `ptx/<module>.ptx`
//! (a missing file is a build error, never a run-time one); the PTX is what NVRTC makes of the
//! sources with the pinned toolchain (`cargo xtask ptx --check` proves it in CI). This crate
//! has no code of its own: the host side of each kernel (its declaration, CPU twin and
//! emitter) lives in `solder-model-layers`' `kernels` module.

#![forbid(unsafe_code)]

/// Embeds one text per module from `$dir/<module>.$ext`, in the order given.
macro_rules! embedded {
    ($dir:literal, $ext:literal: $($module:literal),* $(,)?) => {
        &[$(($module, include_str!(concat!("../", $dir, "/", $module, ".", $ext)))),*]
    };
}

/// The kernel modules, one per `cuda/<module>.cu`, sorted.
pub const MODULES: &[&str] = &[
    "act", "add", "attn", "embed", "gdn", "gemv", "kv", "moe", "norm", "rope",
];

/// Every module's PTX, by module name, in `MODULES` order.
pub const PTX: &[(&str, &str)] = embedded!(
    "ptx", "ptx": "act", "add", "attn", "embed", "gdn", "gemv", "kv", "moe", "norm", "rope",
);

/// Every module's CUDA C source, by module name, in `MODULES` order (the host side checks
/// its declarations against these signatures).
pub const SOURCES: &[(&str, &str)] = embedded!(
    "cuda", "cu": "act", "add", "attn", "embed", "gdn", "gemv", "kv", "moe", "norm", "rope",
);

/// The shared device helpers every module includes.
pub const COMMON_HEADER: &str = include_str!("../cuda/common.cuh");

/// The embedded PTX of `module`.
pub fn ptx(module: &str) -> Option<&'static str> {
    PTX.iter()
        .find(|(m, _)| *m == module)
        .map(|(_, text)| *text)
}

/// The embedded CUDA C source of `module`.
pub fn source(module: &str) -> Option<&'static str> {
    SOURCES
        .iter()
        .find(|(m, _)| *m == module)
        .map(|(_, text)| *text)
}

/// The source folders, relative to the workspace root (for `cargo xtask ptx`).
pub const CUDA_DIR: &str = "crates/kernels/cuda";
pub const PTX_DIR: &str = "crates/kernels/ptx";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_module_is_embedded_once_in_order() {
        let ptx: Vec<&str> = PTX.iter().map(|(m, _)| *m).collect();
        let cu: Vec<&str> = SOURCES.iter().map(|(m, _)| *m).collect();
        assert_eq!(ptx, MODULES);
        assert_eq!(cu, MODULES);
        let mut sorted = MODULES.to_vec();
        sorted.sort();
        assert_eq!(sorted, MODULES);
        for (module, text) in PTX {
            assert!(text.contains(".entry"), "{module}.ptx defines no kernel");
        }
        for (module, text) in SOURCES {
            assert!(
                text.contains("extern \"C\""),
                "{module}.cu declares no kernel"
            );
        }
    }

    #[test]
    fn the_folders_hold_exactly_the_modules() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/");
        for (dir, ext) in [("cuda", "cu"), ("ptx", "ptx")] {
            let mut found: Vec<String> = std::fs::read_dir(format!("{root}{dir}"))
                .unwrap()
                .filter_map(|e| {
                    let path = e.unwrap().path();
                    (path.extension()? == ext)
                        .then(|| path.file_stem()?.to_str().map(str::to_string))?
                })
                .collect();
            found.sort();
            assert_eq!(found, MODULES, "{dir}/*.{ext}");
        }
    }
}
