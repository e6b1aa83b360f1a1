//! Ties every declaration to its CUDA signature: the `extern "C"` kernels of each
//! `crates/kernels/cuda/<module>.cu` (embedded by `solder-kernels`) are parsed, and each
//! declaration's parameters must match its function's in order, name, element type and
//! access (`const T*` read-only, `T*` written), and every CUDA kernel must be declared.
//! A mismatch fails here, in CI, rather than on a GPU.

use std::collections::BTreeMap;

use solder_gpu_runtime::Access;

use super::{registry, ParamKind};

/// One CUDA parameter as written.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CudaParam {
    name: String,
    /// `bf16`, `f32`, `i32`, `u32`, `u8`.
    elem: &'static str,
    pointer: bool,
    constant: bool,
}

/// Removes `//` and `/* */` comments.
fn strip_comments(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("//") {
            rest = after.find('\n').map_or("", |i| &after[i..]);
        } else if let Some(after) = rest.strip_prefix("/*") {
            rest = after.find("*/").map_or("", |i| &after[i + 2..]);
        } else {
            let c = rest.chars().next().expect("non-empty");
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

fn c_type(words: &[&str]) -> Result<&'static str, String> {
    match words {
        ["bf16"] | ["__nv_bfloat16"] => Ok("bf16"),
        ["float"] => Ok("f32"),
        ["int"] | ["int32_t"] => Ok("i32"),
        ["unsigned"] | ["unsigned", "int"] | ["uint32_t"] => Ok("u32"),
        ["unsigned", "char"] | ["uint8_t"] => Ok("u8"),
        other => Err(format!("unknown CUDA parameter type {other:?}")),
    }
}

fn parse_param(text: &str) -> Result<CudaParam, String> {
    let spaced = text.replace('*', " * ");
    let mut words: Vec<&str> = spaced
        .split_whitespace()
        .filter(|w| *w != "__restrict__")
        .collect();
    let name = words
        .pop()
        .ok_or_else(|| format!("empty parameter in `{text}`"))?;
    let constant = words.contains(&"const");
    let pointer = words.contains(&"*");
    let type_words: Vec<&str> = words
        .into_iter()
        .filter(|w| *w != "const" && *w != "*")
        .collect();
    Ok(CudaParam {
        name: name.to_string(),
        elem: c_type(&type_words).map_err(|e| format!("`{text}`: {e}"))?,
        pointer,
        constant,
    })
}

/// The text between the `(` at `open` and its matching `)`.
fn balanced(text: &str, open: usize) -> Option<(&str, usize)> {
    let mut depth = 0usize;
    for (i, c) in text[open..].char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return Some((&text[open + 1..open + i], open + i + 1));
                }
            }
            _ => {}
        }
    }
    None
}

/// Every `extern "C" __global__` function of `source` (also through `#define`d prefixes), by
/// name.
fn cuda_kernels(source: &str) -> Result<BTreeMap<String, Vec<CudaParam>>, String> {
    const MARKER: &str = "extern \"C\" __global__";
    let text = strip_comments(source);
    let mut prefixes = vec![MARKER.to_string()];
    for line in text.lines() {
        let line = line.trim_start();
        if let Some(define) = line.strip_prefix("#define ") {
            if define.contains(MARKER) {
                let name = define.split_whitespace().next().unwrap_or_default();
                prefixes.push(name.to_string());
            }
        }
    }
    let body: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    let mut kernels = BTreeMap::new();
    for prefix in &prefixes {
        let mut from = 0;
        while let Some(at) = body[from..].find(prefix.as_str()) {
            let start = from + at + prefix.len();
            let boundary_ok = body[..from + at]
                .chars()
                .last()
                .is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
            from = start;
            if !boundary_ok {
                continue;
            }
            let mut rest = body[start..].trim_start();
            rest = rest.strip_prefix("void").unwrap_or(rest).trim_start();
            let mut offset = body.len() - rest.len();
            if rest.starts_with("__launch_bounds__") {
                let open = offset + rest.find('(').ok_or("unclosed __launch_bounds__")?;
                let (_, end) = balanced(&body, open).ok_or("unbalanced __launch_bounds__")?;
                offset = end;
            }
            let rest = &body[offset..];
            let open = offset + rest.find('(').ok_or("a kernel without parameters")?;
            let name = body[offset..open].trim().to_string();
            if name.is_empty() || !name.chars().all(|c| c.is_alphanumeric() || c == '_') {
                return Err(format!(
                    "cannot read the kernel name in `{}`",
                    &body[offset..open]
                ));
            }
            let (params, end) = balanced(&body, open).ok_or("unbalanced parameter list")?;
            let params = params
                .split(',')
                .map(parse_param)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("{name}: {e}"))?;
            kernels.insert(name, params);
            from = end;
        }
    }
    Ok(kernels)
}

/// Why `cuda` does not take what `decl` declares, if it does not.
fn mismatch(decl: &super::KernelDecl, cuda: &[CudaParam]) -> Option<String> {
    let declared: Vec<String> = decl.params.iter().map(|p| p.name.to_string()).collect();
    let written: Vec<String> = cuda.iter().map(|p| p.name.clone()).collect();
    if declared != written {
        return Some(format!(
            "parameters {declared:?}, the CUDA kernel takes {written:?}"
        ));
    }
    for (p, c) in decl.params.iter().zip(cuda) {
        let ok = match p.kind {
            ParamKind::Buffer { elem, access, .. } => {
                c.pointer && c.elem == elem && (c.constant == (access == Access::Read))
            }
            ParamKind::U32 => !c.pointer && c.elem == "u32",
            ParamKind::I32 => !c.pointer && c.elem == "i32",
            ParamKind::F32 => !c.pointer && c.elem == "f32",
        };
        if !ok {
            return Some(format!(
                "`{}` is declared {:?}, the CUDA kernel has {c:?}",
                p.name, p.kind
            ));
        }
    }
    None
}

#[test]
fn every_declaration_matches_its_cuda_signature() {
    let mut failures = Vec::new();
    let mut cuda = BTreeMap::new();
    for (module, source) in solder_kernels::SOURCES {
        match cuda_kernels(source) {
            Ok(kernels) => {
                for (name, params) in kernels {
                    cuda.insert(format!("{module}::{name}"), params);
                }
            }
            Err(e) => failures.push(format!("crates/kernels/cuda/{module}.cu: {e}")),
        }
    }
    for decl in registry() {
        match cuda.get(decl.name) {
            None => failures.push(format!(
                "{}: declared, but crates/kernels/cuda/{}.cu has no such kernel",
                decl.name,
                decl.module()
            )),
            Some(params) => {
                if let Some(why) = mismatch(decl, params) {
                    failures.push(format!("{}: {why}", decl.name));
                }
            }
        }
    }
    // A variant entry takes its kernel's arguments.
    for (entry, base) in super::variants() {
        match (cuda.get(entry), super::decl(base)) {
            (None, _) => failures.push(format!(
                "{entry}: a variant of `{base}`, but no CUDA kernel"
            )),
            (_, None) => failures.push(format!(
                "{entry}: a variant of `{base}`, which is not declared"
            )),
            (Some(params), Some(decl)) => {
                if let Some(why) = mismatch(decl, params) {
                    failures.push(format!("{entry} (a variant of {base}): {why}"));
                }
            }
        }
    }
    for name in cuda.keys() {
        if super::decl(name).is_none() && super::variant_of(name).is_none() {
            failures.push(format!("{name}: a CUDA kernel without a declaration"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(cuda.len() >= 39, "parsed only {} CUDA kernels", cuda.len());
}

#[test]
fn the_parser_reads_pointers_constness_and_launch_bounds() {
    let source = "// a comment (with, commas)\n#define K extern \"C\" __global__ void __launch_bounds__(256, 1)\n\
        extern \"C\" __global__ void __launch_bounds__(128) a(const float* __restrict__ x,\n\
        bf16* y, unsigned n, float eps) {}\n\
        K b(const int* ids, unsigned int rows) {}\n";
    let kernels = cuda_kernels(source).unwrap();
    assert_eq!(kernels.len(), 2);
    let a = &kernels["a"];
    assert_eq!(
        (a[0].elem, a[0].pointer, a[0].constant, a[0].name.as_str()),
        ("f32", true, true, "x")
    );
    assert_eq!(
        (a[1].elem, a[1].pointer, a[1].constant),
        ("bf16", true, false)
    );
    assert_eq!((a[2].elem, a[2].pointer), ("u32", false));
    assert_eq!(kernels["b"][1].elem, "u32");
}

#[test]
fn a_drifted_declaration_is_caught() {
    // The declaration of `norm::rms_norm` against a CUDA kernel with two parameters swapped,
    // then with a written buffer declared const.
    let decl = super::decl("norm::rms_norm").unwrap();
    let swapped = cuda_kernels(
        "extern \"C\" __global__ void rms_norm(const bf16* w, const float* x, bf16* out, unsigned rows, unsigned hidden, float eps) {}",
    )
    .unwrap();
    assert!(mismatch(decl, &swapped["rms_norm"]).is_some());
    let constant = cuda_kernels(
        "extern \"C\" __global__ void rms_norm(const float* x, const bf16* w, const bf16* out, unsigned rows, unsigned hidden, float eps) {}",
    )
    .unwrap();
    assert!(mismatch(decl, &constant["rms_norm"])
        .unwrap()
        .contains("`out`"));
    let right = cuda_kernels(
        "extern \"C\" __global__ void rms_norm(const float* x, const bf16* w, bf16* out, unsigned rows, unsigned hidden, float eps) {}",
    )
    .unwrap();
    assert_eq!(mismatch(decl, &right["rms_norm"]), None);
}

#[test]
fn names_are_unique_and_modules_known() {
    let mut names = super::kernel_names();
    let count = names.len();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), count, "a kernel is declared twice");
    for decl in registry() {
        assert!(
            solder_kernels::MODULES.contains(&decl.module()),
            "{}: no module `{}`",
            decl.name,
            decl.module()
        );
    }
}
