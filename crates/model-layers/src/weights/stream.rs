//! Loading without a host copy of the model: every part of every slot is converted in checkpoint
//! order (shard by shard, by offset within a shard) into one reused host buffer and handed to
//! the caller's `put` (an upload), then its mapped pages are given back (`Checkpoint::release`).
//! A bf16 tensor stored as BF16 goes from the mapping to `put` with no copy.
//!
//! Progress (`crate::progress`): bytes handed to `put`, a big part in pieces of `PIECE` bytes
//! so the count moves within it; one `tracing` event per shard as well.
//!
//! Invariants: the host holds at most one part's converted bytes at a time (the buffer's
//! capacity is the largest part), plus the mapped pages of the part being read; every check
//! `HostWeights::load_quantized` makes is made first (`check_checkpoint`), before any `put`.

use solder_circuit::ir::Circuit;
use solder_config::Quantization;

use super::read::{self, PartRead};
use crate::checkpoint::Checkpoint;
use crate::error::WeightsError;
use crate::progress::{Progress, Unit};

/// The most bytes one `put` is handed: a bigger part goes in pieces (consecutive offsets), so
/// progress moves while it uploads.
const PIECE: usize = 64 << 20;

/// What a streaming load did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Streamed {
    /// Bytes handed to `put` (every slot's bytes).
    pub bytes: usize,
    /// The host buffer's largest size: the largest converted part.
    pub buffer_bytes: usize,
    /// Parts handed over.
    pub parts: usize,
}

/// Streams every slot of `circuit` from `checkpoint`: `put(slot, offset, bytes)` receives the
/// bytes of the part at `offset` in slot `slot`.
pub(crate) fn stream<E: From<WeightsError>>(
    circuit: &Circuit,
    checkpoint: &Checkpoint,
    quant: Option<&Quantization>,
    mut put: impl FnMut(usize, usize, &[u8]) -> Result<(), E>,
) -> Result<Streamed, E> {
    super::check_checkpoint(circuit, checkpoint, quant)?;
    // (file, offset in the file, slot, offset in the slot, the part)
    let mut parts: Vec<(usize, usize, usize, usize, PartRead<'_>)> = Vec::new();
    for (index, slot) in circuit.weights.iter().enumerate() {
        for (name, offset, shape) in read::parts(slot) {
            let part = read::resolve(checkpoint, quant, name, shape, slot.format)?;
            let (file, at) = part
                .tensors()
                .first()
                .and_then(|t| checkpoint.position(t))
                .unwrap_or((usize::MAX, 0));
            parts.push((file, at, index, offset, part));
        }
    }
    // Checkpoint order: one shard's pages are touched, then given back, before the next's.
    parts.sort_by_key(|&(file, at, ..)| (file, at));
    let total: usize = parts.iter().map(|p| p.4.bytes()).sum();
    let shard_total = |file: usize| -> usize {
        parts
            .iter()
            .filter(|p| p.0 == file)
            .map(|p| p.4.bytes())
            .sum()
    };
    let mut buffer: Vec<u8> = Vec::new();
    let mut done = Streamed::default();
    let mut progress = Progress::new("loading weights", Unit::Bytes, total);
    let mut put = |slot: usize, offset: usize, bytes: &[u8]| -> Result<(), E> {
        in_pieces(bytes, PIECE, |at, piece| {
            put(slot, offset + at, piece)?;
            progress.advance(piece.len());
            Ok(())
        })
    };
    let mut shard_done = 0usize;
    for (i, (file, _, slot, offset, part)) in parts.iter().enumerate() {
        let bytes = part.bytes();
        if let Some(borrowed) = part.borrowed() {
            put(*slot, *offset, borrowed)?;
        } else {
            buffer.clear();
            buffer.resize(bytes, 0);
            part.write(&mut buffer)?;
            put(*slot, *offset, &buffer)?;
            done.buffer_bytes = done.buffer_bytes.max(bytes);
        }
        for tensor in part.tensors() {
            checkpoint.release(tensor);
        }
        done.bytes += bytes;
        done.parts += 1;
        shard_done += bytes;
        if parts.get(i + 1).is_none_or(|next| next.0 != *file) {
            let shard = checkpoint.file_path(*file).unwrap_or(&checkpoint.dir);
            tracing::info!(
                shard = %shard.display(),
                shard_bytes_done = shard_done,
                shard_bytes_total = shard_total(*file),
                bytes_done = done.bytes,
                bytes_total = total,
                "streamed a checkpoint shard to the device"
            );
            shard_done = 0;
        }
    }
    // The buffer is freed here: nothing of the model stays on the host.
    drop(buffer);
    progress.finish();
    tracing::info!(
        bytes = done.bytes,
        parts = done.parts,
        buffer_bytes = done.buffer_bytes,
        dir = %checkpoint.dir.display(),
        "streamed weights"
    );
    Ok(done)
}

/// Hands `bytes` to `put` in pieces of at most `piece` bytes, each with its offset in `bytes`
/// (an empty `bytes` as one empty piece).
fn in_pieces<E>(
    bytes: &[u8],
    piece: usize,
    mut put: impl FnMut(usize, &[u8]) -> Result<(), E>,
) -> Result<(), E> {
    if bytes.is_empty() {
        return put(0, bytes);
    }
    for (i, part) in bytes.chunks(piece).enumerate() {
        put(i * piece, part)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::in_pieces;

    #[test]
    fn a_part_goes_in_pieces_at_consecutive_offsets() {
        let bytes: Vec<u8> = (0..10).collect();
        let mut got = Vec::new();
        in_pieces(&bytes, 4, |at, piece| -> Result<(), ()> {
            got.push((at, piece.to_vec()));
            Ok(())
        })
        .unwrap();
        assert_eq!(
            got,
            [
                (0, vec![0, 1, 2, 3]),
                (4, vec![4, 5, 6, 7]),
                (8, vec![8, 9])
            ]
        );
        let mut empty = Vec::new();
        in_pieces(&[], 4, |at, piece| -> Result<(), ()> {
            empty.push((at, piece.len()));
            Ok(())
        })
        .unwrap();
        assert_eq!(empty, [(0, 0)], "an empty part is still handed over");
    }
}
