//! solder's CUDA kernels: the CUDA C sources (`cuda/<module>.cu`, shared device helpers in
//! `cuda/common.cuh`) and the PTX `cargo xtask ptx` generates from them, checked in deflated
//! (`ptx/<module>.ptx.deflate`, [`pack_ptx`]: PTX is verbose text, and a device run carries
//! the working tree), both embedded here by module name so that a binary needs no files and no
//! CUDA toolkit.
//!
//! Invariants: [`MODULES`] names exactly the files `cuda/<module>.cu` and
//! `ptx/<module>.ptx.deflate` (a missing file is a build error, never a run-time one); the PTX
//! is what NVRTC makes of the
//! sources with the pinned toolchain (`cargo xtask ptx --check` proves it in CI). This crate
//! has no code of its own: the host side of each kernel (its declaration, CPU twin and
//! emitter) lives in `solder-model-layers`' `kernels` module.

#![forbid(unsafe_code)]

use std::sync::OnceLock;

// `MODULES`, the packed PTX (`PTX_PACKED`, `PTX_UNPACKED_BYTES`, `PTX_LENGTHS`,
// `PTX_SHA256`) and `SOURCE_TEXTS`, written by build.rs. Every item is a `static` or a small
// const: the PTX is embedded once whatever the number of its users (a `const` slice of
// `include_str!` is copied into every crate that names it).
include!(concat!(env!("OUT_DIR"), "/modules.rs"));

/// Every module's CUDA C source, by module name, in `MODULES` order (the host side checks
/// its declarations against these signatures).
pub static SOURCES: &[(&str, &str)] = SOURCE_TEXTS;

/// The shared device helpers every module includes.
pub static COMMON_HEADER: &str = include_str!("../cuda/common.cuh");

/// Every module's PTX, by module name, in `MODULES` order: unpacked on first use (a few tens of
/// milliseconds), then shared for the life of the process.
pub fn ptx_modules() -> &'static [(&'static str, &'static str)] {
    static UNPACKED: OnceLock<Vec<(&'static str, &'static str)>> = OnceLock::new();
    UNPACKED.get_or_init(|| {
        let bytes =
            miniz_oxide::inflate::decompress_to_vec_with_limit(PTX_PACKED, PTX_UNPACKED_BYTES)
                .expect("the PTX blob build.rs packed unpacks");
        let text: &'static str = Box::leak(
            String::from_utf8(bytes)
                .expect("the PTX build.rs packed is UTF-8")
                .into_boxed_str(),
        );
        let mut rest = text;
        MODULES
            .iter()
            .zip(PTX_LENGTHS)
            .map(|(module, &len)| {
                let (ptx, tail) = rest.split_at(len);
                rest = tail;
                (*module, ptx)
            })
            .collect()
    })
}

/// The embedded PTX of `module`.
pub fn ptx(module: &str) -> Option<&'static str> {
    ptx_modules()
        .iter()
        .find(|(m, _)| *m == module)
        .map(|(_, text)| *text)
}

/// The SHA-256 (lowercase hex) of `module`'s embedded PTX, known without unpacking it: what a
/// cubin assembled from that PTX is matched against.
pub fn ptx_sha256(module: &str) -> Option<&'static str> {
    MODULES
        .iter()
        .position(|m| *m == module)
        .map(|i| PTX_SHA256[i])
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

/// The suffix of a module's checked-in PTX file in [`PTX_DIR`]: `<module>.ptx.deflate`.
pub const PACKED_PTX_SUFFIX: &str = ".ptx.deflate";

/// The checked-in file name of `module`'s PTX.
pub fn packed_ptx_file(module: &str) -> String {
    format!("{module}{PACKED_PTX_SUFFIX}")
}

/// The module a file name in [`PTX_DIR`] holds the PTX of, if it is a packed PTX file.
pub fn packed_ptx_module(file_name: &str) -> Option<&str> {
    file_name
        .strip_suffix(PACKED_PTX_SUFFIX)
        .filter(|m| !m.is_empty())
}

/// PTX text as it is checked in: raw deflate at level 9 (the same text gives the same bytes).
pub fn pack_ptx(text: &str) -> Vec<u8> {
    miniz_oxide::deflate::compress_to_vec(text.as_bytes(), 9)
}

/// The PTX text of a checked-in file's bytes ([`pack_ptx`]'s inverse); an error names what is
/// wrong with them.
pub fn unpack_ptx(bytes: &[u8]) -> Result<String, String> {
    let raw = miniz_oxide::inflate::decompress_to_vec(bytes)
        .map_err(|e| format!("not a deflate stream ({e:?})"))?;
    String::from_utf8(raw).map_err(|e| format!("the unpacked PTX is not UTF-8 ({e})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_module_is_embedded_once_in_order() {
        let ptx: Vec<&str> = ptx_modules().iter().map(|(m, _)| *m).collect();
        let cu: Vec<&str> = SOURCES.iter().map(|(m, _)| *m).collect();
        assert_eq!(ptx, MODULES);
        assert_eq!(cu, MODULES);
        let mut sorted = MODULES.to_vec();
        sorted.sort();
        assert_eq!(sorted, MODULES);
        for (module, text) in ptx_modules() {
            assert!(text.contains(".entry"), "{module}.ptx defines no kernel");
        }
        for (module, text) in SOURCES.iter() {
            assert!(
                text.contains("extern \"C\""),
                "{module}.cu declares no kernel"
            );
        }
    }

    /// The unpacked PTX is the file's text, byte for byte, and its digest is the file's.
    #[test]
    fn the_packed_ptx_unpacks_to_the_files() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/");
        for (module, text) in ptx_modules() {
            let bytes = std::fs::read(format!("{root}ptx/{}", packed_ptx_file(module))).unwrap();
            let file = unpack_ptx(&bytes).unwrap();
            assert!(file == *text, "{module}.ptx differs from its embedded copy");
            assert_eq!(ptx(module), Some(*text));
            let digest = ptx_sha256(module).unwrap();
            assert_eq!(digest.len(), 64, "{module}: {digest}");
        }
        assert_eq!(ptx("nope"), None);
        assert_eq!(ptx_sha256("nope"), None);
    }

    #[test]
    fn the_folders_hold_exactly_the_modules() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/");
        let names = |dir: &str| -> Vec<String> {
            std::fs::read_dir(format!("{root}{dir}"))
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        };
        let mut cu: Vec<String> = names("cuda")
            .iter()
            .filter_map(|n| n.strip_suffix(".cu").map(str::to_string))
            .collect();
        cu.sort();
        assert_eq!(cu, MODULES, "cuda/*.cu");
        let mut ptx: Vec<String> = names("ptx")
            .iter()
            .filter_map(|n| packed_ptx_module(n).map(str::to_string))
            .collect();
        ptx.sort();
        assert_eq!(ptx, MODULES, "ptx/*{PACKED_PTX_SUFFIX}");
    }

    #[test]
    fn packing_round_trips_and_bad_bytes_are_named() {
        let text = ".version 8.8\n.target sm_90\n.visible .entry k() { ret; }\n";
        assert_eq!(unpack_ptx(&pack_ptx(text)).unwrap(), text);
        assert_eq!(pack_ptx(text), pack_ptx(text));
        assert!(unpack_ptx(b"plain text").unwrap_err().contains("deflate"));
        assert_eq!(packed_ptx_module("gemv.ptx.deflate"), Some("gemv"));
        assert_eq!(packed_ptx_module("gemv.ptx"), None);
        assert_eq!(packed_ptx_module(".ptx.deflate"), None);
    }
}
