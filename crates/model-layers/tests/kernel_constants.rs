//! Constants the CUDA sources and the Rust launch builders share must agree: a drift would
//! make a kernel silently skip work the CPU twin does.

fn cuda_define(file: &str, name: &str) -> u32 {
    let module = file.trim_end_matches(".cu");
    let path = format!("crates/kernels/cuda/{file}");
    let text = solder_kernels::source(module).unwrap_or_else(|| panic!("{path}: not embedded"));
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("#define {name} ")))
        .unwrap_or_else(|| panic!("{path}: no #define {name}"));
    let value = line
        .split_whitespace()
        .nth(2)
        .unwrap_or("")
        .trim_end_matches('u');
    value
        .parse()
        .unwrap_or_else(|_| panic!("{path}: `{line}` is not a number"))
}

#[test]
fn attention_constants_match_attn_cu() {
    use solder_model_layers::kernels::attn::{ATTN_MAX_HEAD_DIM, ATTN_SPLITS};
    assert_eq!(cuda_define("attn.cu", "ATTN_SPLITS"), ATTN_SPLITS);
    assert_eq!(
        cuda_define("attn.cu", "ATTN_MAX_HEAD_DIM"),
        ATTN_MAX_HEAD_DIM
    );
    assert_eq!(
        cuda_define("attn.cu", "OFOLD_HEADER_WORDS") as usize,
        solder_model_layers::kernels::attn::fold::O_SCRATCH_HEADER_WORDS
    );
}

#[test]
fn recurrence_constants_match_gdn_cu() {
    assert_eq!(
        cuda_define("gdn.cu", "GDN_MAX_DK"),
        solder_model_layers::kernels::gdn::GDN_MAX_DK
    );
    assert_eq!(
        cuda_define("gdn.cu", "GDN_COLUMNS"),
        solder_model_layers::kernels::gdn::GDN_COLUMNS
    );
}

/// docs/PERFORMANCE.md's split-K tables are `split_table()`'s text, between its markers.
#[test]
fn the_split_k_tables_in_the_docs_are_the_declarations_shapes() {
    let doc = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/PERFORMANCE.md"),
    )
    .expect("docs/PERFORMANCE.md");
    let (begin, end) = ("<!-- split-table:begin -->\n", "<!-- split-table:end -->");
    let start = doc.find(begin).expect("the begin marker") + begin.len();
    let stop = doc[start..].find(end).expect("the end marker") + start;
    let generated = solder_model_layers::kernels::gemv::split_table();
    assert_eq!(
        doc[start..stop],
        generated,
        "docs/PERFORMANCE.md's split-K tables differ from split_table(); paste:\n{generated}"
    );
}
