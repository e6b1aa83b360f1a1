//! Twin results do not depend on the number of host threads.

mod common;

use common::*;
use solder_gpu_runtime::{par_chunks_mut, GpuBackend, KernelArg, StreamId};

#[test]
fn par_chunks_mut_is_identical_for_any_thread_count() {
    let reference = {
        let mut out = vec![0u64; 1001];
        par_chunks_mut(&mut out, 7, 1, |chunk_index, chunk| {
            for (i, x) in chunk.iter_mut().enumerate() {
                *x = (chunk_index * 7 + i) as u64 * 31 + chunk_index as u64;
            }
        });
        out
    };
    for threads in [2, 3, 7] {
        let mut out = vec![0u64; 1001];
        par_chunks_mut(&mut out, 7, threads, |chunk_index, chunk| {
            for (i, x) in chunk.iter_mut().enumerate() {
                *x = (chunk_index * 7 + i) as u64 * 31 + chunk_index as u64;
            }
        });
        assert_eq!(out, reference, "{threads} threads");
    }
}

#[test]
fn twin_output_bytes_are_identical_for_1_2_3_and_7_threads() {
    let elements = 997;
    let mut outputs = Vec::new();
    for threads in [1, 2, 3, 7] {
        let mut gpu = backend_with_threads(threads);
        let out = gpu.alloc(bytes(elements)).unwrap();
        let kernel = k(&gpu, "poly");
        gpu.launch(
            StreamId(0),
            kernel,
            &cfg(),
            &[KernelArg::write(out, bytes(elements))],
        )
        .unwrap();
        let values = download(&mut gpu, out, elements);
        assert!(
            values.iter().all(|x| x.is_finite()),
            "{threads} threads left poison"
        );
        outputs.push(values.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
    }
    assert!(outputs.windows(2).all(|pair| pair[0] == pair[1]));
}
