//! The host emulation of the CUDA kernels as an alternative executor of the CPU backend.
//!
//! `cargo xtask emu` compiles each `crates/kernels/cuda/<module>.cu`, unchanged, with g++ for
//! the host (`crates/kernels/emu/cuda_emu.hpp`) into `libsolder_emu_<module>.so`, which
//! exports `emu_<module>__<kernel>` (runs the grid) and `emu_<module>__<kernel>__sig` (the
//! kernel's parameter kinds). With an [`Emulation`] set, a checked launch runs the emulated CUDA
//! kernel instead of ([`EmuMode::Run`]) or after ([`EmuMode::Shadow`]) its twin; the backend's
//! range, aliasing and race checks are unchanged and come first.
//!
//! Shadow mode proves the CUDA source equal to the twin launch by launch: the writable buffers are
//! snapshotted, the twin runs, its outputs are kept aside and the snapshot restored, then the
//! emulated kernel runs on the same inputs and every writable byte is compared. The emulation's
//! bytes stay (so a whole run executes the CUDA source), and per kernel the launches, the identical
//! ones and the first difference are recorded ([`report`](Emulation::report)).
//!
//! Invariants: an emulated kernel gets each buffer as a fenced copy of its bytes (at the same
//! address modulo 256, between [`FENCE`] bytes of 0xff on either side; the writable ones copied
//! back after it ran), and scalars by value, in the kernel's own parameter order; its parameter
//! kinds are checked against the arguments before it runs. A read past a buffer's bytes (within
//! the fence) reads 0xff — NaN in bf16 and f32 — rather than a neighbour's bytes, and a write
//! into a fence fails the launch, naming the argument: what compute-sanitizer's memcheck finds
//! on a device. Not checked: accesses past the fences.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::{Path, PathBuf};

use crate::error::GpuError;
use crate::twin::{HostArg, TwinCtx, TwinFn};
use crate::types::LaunchConfig;

/// `emu_<module>__<kernel>`: args (one pointer per parameter, to its value), grid, block,
/// dynamic shared bytes, an error buffer and its length; 0 on success.
type RunFn = unsafe extern "C" fn(
    *mut *mut c_void,
    *const u32,
    *const u32,
    u32,
    *mut c_char,
    usize,
) -> c_int;
type SigFn = unsafe extern "C" fn() -> *const c_char;

/// How an emulated launch relates to the twin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EmuMode {
    /// The emulated CUDA kernel runs instead of the twin.
    Run,
    /// The twin runs, then the emulated kernel on the same inputs; outputs compared.
    Shadow,
}

/// Shadow mode's record of one kernel.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KernelParity {
    pub launches: u64,
    /// Launches whose every writable byte the emulation wrote as the twin did (two f32 NaNs
    /// count as equal whatever their bits: `same_element`).
    pub identical: u64,
    /// The first difference seen: argument, element, twin and emulated values.
    pub first_mismatch: Option<String>,
    /// The largest `max |twin − emulated| / max |twin|` of a writable bf16 or f32 buffer
    /// over the launches (infinite: an integer or untyped byte differed, or a NaN met a
    /// number).
    pub max_relative: f64,
}

/// The file `cargo xtask emu` builds for `module` in `dir`.
pub fn library_path(dir: &Path, module: &str) -> PathBuf {
    dir.join(format!("libsolder_emu_{module}.so"))
}

struct EmuKernel {
    run: RunFn,
    /// One code per parameter: `H`/`F`/`I`/`U` pointers to bf16/f32/i32/u32 (`P` other),
    /// `i`/`u`/`f` scalars.
    signature: Vec<u8>,
}

pub struct Emulation {
    mode: EmuMode,
    /// Kept loaded while any `EmuKernel` (whose function pointers point into them) exists.
    libraries: BTreeMap<String, libloading::Library>,
    kernels: HashMap<String, EmuKernel>,
    report: BTreeMap<String, KernelParity>,
    /// (kernel, argument) pairs whose bytes are the kernel's own scratch, not compared.
    scratch: std::collections::BTreeSet<(String, usize)>,
}

impl Emulation {
    /// Loads `libsolder_emu_<module>.so` from `dir` for every module.
    pub fn open(dir: &Path, modules: &[&str], mode: EmuMode) -> Result<Emulation, GpuError> {
        let mut libraries = BTreeMap::new();
        for module in modules {
            let path = library_path(dir, module);
            // SAFETY: the library is one `cargo xtask emu` built from the kernel sources; its
            // initialisers only set up the emulator's statics.
            let library =
                unsafe { libloading::Library::new(&path) }.map_err(|e| GpuError::Driver {
                    call: "emulation",
                    message: format!("{}: {e} (build it with `cargo xtask emu`)", path.display()),
                })?;
            libraries.insert(module.to_string(), library);
        }
        Ok(Emulation {
            mode,
            libraries,
            kernels: HashMap::new(),
            report: BTreeMap::new(),
            scratch: Default::default(),
        })
    }

    /// Shadow mode does not compare argument `index` of `kernel`: its bytes are working
    /// memory whose contents the kernel's contract leaves open (a twin need not write them).
    pub fn scratch_argument(&mut self, kernel: &str, index: usize) {
        self.scratch.insert((kernel.to_string(), index));
    }

    pub fn mode(&self) -> EmuMode {
        self.mode
    }

    /// Per kernel (`module::func`), shadow mode's record.
    pub fn report(&self) -> &BTreeMap<String, KernelParity> {
        &self.report
    }

    fn kernel(&mut self, name: &str) -> Result<&EmuKernel, GpuError> {
        if !self.kernels.contains_key(name) {
            let resolved = self.resolve(name)?;
            self.kernels.insert(name.to_string(), resolved);
        }
        Ok(&self.kernels[name])
    }

    fn resolve(&self, name: &str) -> Result<EmuKernel, GpuError> {
        let missing = |what: String| GpuError::Kernel {
            kernel: name.to_string(),
            message: format!("no emulation: {what} (rebuild with `cargo xtask emu`)"),
        };
        let (module, func) = name
            .split_once("::")
            .ok_or_else(|| missing("not a `module::func` name".into()))?;
        let library = self
            .libraries
            .get(module)
            .ok_or_else(|| missing(format!("module `{module}` has no emulation library")))?;
        let symbol = format!("emu_{module}__{func}");
        // SAFETY: the generator exports this symbol with exactly `RunFn`'s signature.
        let run: RunFn = unsafe { library.get::<RunFn>(symbol.as_bytes()) }
            .map(|s| *s)
            .map_err(|_| missing(format!("the library exports no `{symbol}`")))?;
        // SAFETY: as above, `SigFn`; it returns a pointer to a static NUL-terminated string.
        let sig: SigFn = unsafe { library.get::<SigFn>(format!("{symbol}__sig").as_bytes()) }
            .map(|s| *s)
            .map_err(|_| missing(format!("the library exports no `{symbol}__sig`")))?;
        // SAFETY: `sig` returns a static C string (see above).
        let signature = unsafe { CStr::from_ptr(sig()) }.to_bytes().to_vec();
        Ok(EmuKernel { run, signature })
    }

    /// Runs the launch (already checked by the backend) through the emulation.
    ///
    /// # Safety
    /// Every buffer of `args` lies inside a live allocation, no writable buffer overlaps
    /// another argument, and nothing else accesses them during the call.
    pub(super) unsafe fn launch(
        &mut self,
        name: &str,
        config: &LaunchConfig,
        args: &[HostArg],
        twin: TwinFn,
        threads: usize,
    ) -> Result<(), GpuError> {
        let mode = self.mode;
        let kernel = self.kernel(name)?;
        check_signature(name, &kernel.signature, args)?;
        let run = kernel.run;
        let signature = kernel.signature.clone();
        if mode == EmuMode::Run {
            // SAFETY: the caller's contract, and the signature matches the arguments.
            return unsafe { run_emulated(name, run, config, args) };
        }
        let writable: Vec<(usize, *mut u8, usize)> = args
            .iter()
            .enumerate()
            .filter_map(|(index, arg)| match *arg {
                HostArg::Buffer { ptr, bytes, access } if access.writes() => {
                    Some((index, ptr, bytes))
                }
                _ => None,
            })
            .collect();
        let read = |ptr: *mut u8, bytes: usize| {
            // SAFETY: every range read is a writable argument's, inside a live allocation
            // that nothing else touches during the launch (the caller's contract).
            unsafe { std::slice::from_raw_parts(ptr, bytes) }.to_vec()
        };
        let before: Vec<Vec<u8>> = writable.iter().map(|&(_, p, n)| read(p, n)).collect();
        {
            // SAFETY: the caller's contract is `TwinCtx::new`'s.
            let ctx = unsafe { TwinCtx::new(name, config, args.to_vec(), threads) };
            twin(&ctx)?;
        }
        let from_twin: Vec<Vec<u8>> = writable.iter().map(|&(_, p, n)| read(p, n)).collect();
        for (&(_, ptr, bytes), saved) in writable.iter().zip(&before) {
            // SAFETY: as above; `saved` is a distinct host copy of the same length.
            unsafe { std::ptr::copy_nonoverlapping(saved.as_ptr(), ptr, bytes) };
        }
        // SAFETY: the caller's contract, and the signature matches the arguments.
        unsafe { run_emulated(name, run, config, args) }?;
        let mut mismatch = None;
        let mut max_relative = 0.0f64;
        for (&(index, ptr, bytes), twin_bytes) in writable.iter().zip(&from_twin) {
            if self.scratch.contains(&(name.to_string(), index)) {
                continue;
            }
            let emu_bytes = read(ptr, bytes);
            let code = signature.get(index).copied().unwrap_or(b'P');
            max_relative = max_relative.max(relative_difference(code, twin_bytes, &emu_bytes));
            if mismatch.is_none() {
                mismatch = first_difference(&signature, index, twin_bytes, &emu_bytes);
            }
        }
        let entry = self.report.entry(name.to_string()).or_default();
        entry.launches += 1;
        entry.max_relative = entry.max_relative.max(max_relative);
        match mismatch {
            None => entry.identical += 1,
            Some(text) => {
                entry.first_mismatch.get_or_insert(format!(
                    "{text} (grid {:?}, block {:?})",
                    config.grid, config.block
                ));
            }
        }
        Ok(())
    }
}

fn check_signature(name: &str, signature: &[u8], args: &[HostArg]) -> Result<(), GpuError> {
    if signature.len() != args.len() {
        return Err(GpuError::BadArgument {
            kernel: name.to_string(),
            index: args.len().min(signature.len()),
            message: format!(
                "the CUDA kernel takes {} parameters, the launch passes {}",
                signature.len(),
                args.len()
            ),
        });
    }
    for (index, (&code, arg)) in signature.iter().zip(args).enumerate() {
        let fits = match arg {
            HostArg::Buffer { .. } | HostArg::Null => code.is_ascii_uppercase(),
            HostArg::I32(_) => code == b'i',
            HostArg::U32(_) => code == b'u',
            HostArg::F32(_) => code == b'f',
        };
        if !fits {
            return Err(GpuError::BadArgument {
                kernel: name.to_string(),
                index,
                message: format!(
                    "the CUDA parameter is `{}` (emulation code), the launch passes {arg:?}",
                    code as char
                ),
            });
        }
    }
    Ok(())
}

/// Bytes of 0xff on either side of each buffer an emulated kernel gets.
pub const FENCE: usize = 4096;

/// A buffer argument's fenced copy: `FENCE` bytes of 0xff, the buffer's bytes at the original
/// address's offset modulo 256 (so the kernel's alignment tests answer as for the original),
/// then `FENCE` more.
struct Fenced {
    storage: Vec<u8>,
    /// Where the buffer's bytes start in `storage`.
    start: usize,
    bytes: usize,
}

impl Fenced {
    /// # Safety
    /// `ptr` is valid for reads of `bytes` bytes.
    unsafe fn new(ptr: *const u8, bytes: usize) -> Fenced {
        let mut storage = vec![0xffu8; 2 * FENCE + 256 + bytes];
        let base = storage.as_ptr() as usize;
        let start = FENCE + (ptr as usize).wrapping_sub(base + FENCE) % 256;
        // SAFETY: the caller's contract for `ptr`; `storage` holds `start + bytes` bytes and
        // does not overlap the caller's buffer (it was just allocated).
        unsafe { std::ptr::copy_nonoverlapping(ptr, storage[start..].as_mut_ptr(), bytes) };
        Fenced {
            storage,
            start,
            bytes,
        }
    }

    fn ptr(&mut self) -> *mut u8 {
        self.storage[self.start..].as_mut_ptr()
    }

    /// The first byte of a fence the kernel changed, as an offset from the buffer's start
    /// (negative: before it).
    fn breach(&self) -> Option<i64> {
        let end = self.start + self.bytes;
        let before = self.storage[..self.start].iter().position(|&b| b != 0xff);
        let after = self.storage[end..].iter().position(|&b| b != 0xff);
        before
            .map(|i| i as i64 - self.start as i64)
            .or(after.map(|i| (self.bytes + i) as i64))
    }
}

/// # Safety
/// As `Emulation::launch`, and `args` matches the kernel's signature.
unsafe fn run_emulated(
    name: &str,
    run: RunFn,
    config: &LaunchConfig,
    args: &[HostArg],
) -> Result<(), GpuError> {
    let mut fenced: Vec<Option<Fenced>> = args
        .iter()
        .map(|arg| match *arg {
            // SAFETY: the caller's contract: every buffer lies inside a live allocation.
            HostArg::Buffer { ptr, bytes, .. } => Some(unsafe { Fenced::new(ptr, bytes) }),
            _ => None,
        })
        .collect();
    // One 8-byte slot per parameter holding its value (a scalar in the low bytes, little
    // endian as the kernel reads it); the kernel copies `sizeof(param)` bytes from each.
    let mut slots: Vec<u64> = args
        .iter()
        .zip(&mut fenced)
        .map(|(arg, copy)| match (*arg, copy) {
            (HostArg::Buffer { ptr, .. }, copy) => copy.as_mut().map_or(ptr, Fenced::ptr) as u64,
            (HostArg::Null, _) => 0,
            (HostArg::I32(v), _) => u64::from(v as u32),
            (HostArg::U32(v), _) => u64::from(v),
            (HostArg::F32(v), _) => u64::from(v.to_bits()),
        })
        .collect();
    let mut pointers: Vec<*mut c_void> = slots
        .iter_mut()
        .map(|slot| (slot as *mut u64).cast::<c_void>())
        .collect();
    let mut error = [0u8; 768];
    // SAFETY: `pointers` holds one valid slot per parameter (checked against the signature),
    // grid and block are 3 values each, and `error` is writable for its length; the buffers'
    // host addresses are valid for the launch (the caller's contract).
    let rc = unsafe {
        run(
            pointers.as_mut_ptr(),
            config.grid.as_ptr(),
            config.block.as_ptr(),
            config.shared_bytes,
            error.as_mut_ptr().cast::<c_char>(),
            error.len(),
        )
    };
    if rc == 0 {
        // Every fence first, so a breach leaves the caller's buffers as they were.
        for (index, (arg, copy)) in args.iter().zip(&fenced).enumerate() {
            if let (HostArg::Buffer { bytes, .. }, Some(copy)) = (*arg, copy) {
                if let Some(at) = copy.breach() {
                    return Err(GpuError::Kernel {
                        kernel: name.to_string(),
                        message: format!(
                            "emulated launch: wrote byte {at} of argument {index}, outside its \
                             {bytes} bytes"
                        ),
                    });
                }
            }
        }
        for (arg, copy) in args.iter().zip(&fenced) {
            let (HostArg::Buffer { ptr, bytes, access }, Some(copy)) = (*arg, copy) else {
                continue;
            };
            if access.writes() {
                // SAFETY: the caller's contract: a writable buffer is valid for writes of its
                // bytes and overlaps no other argument; the copy holds as many.
                unsafe {
                    std::ptr::copy_nonoverlapping(copy.storage[copy.start..].as_ptr(), ptr, bytes)
                };
            }
        }
        return Ok(());
    }
    let end = error.iter().position(|&b| b == 0).unwrap_or(error.len());
    Err(GpuError::Kernel {
        kernel: name.to_string(),
        message: format!(
            "emulated launch: {}",
            String::from_utf8_lossy(&error[..end])
        ),
    })
}

/// max |twin − emulated| over a buffer of parameter kind `code`, relative to the buffer's
/// largest |twin| element (as `parity --backend cuda` measures a device): 0 when equal;
/// infinite when an integer or untyped byte differs or a NaN meets a number.
fn relative_difference(code: u8, twin: &[u8], emu: &[u8]) -> f64 {
    let values = |bytes: &[u8]| -> Option<Vec<f64>> {
        match code {
            b'H' => Some(
                bytes
                    .chunks_exact(2)
                    .map(|b| f64::from(half::bf16::from_le_bytes([b[0], b[1]]).to_f32()))
                    .collect(),
            ),
            b'F' => Some(
                bytes
                    .chunks_exact(4)
                    .map(|b| f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])))
                    .collect(),
            ),
            _ => None,
        }
    };
    if twin == emu {
        return 0.0;
    }
    let (Some(a), Some(b)) = (values(twin), values(emu)) else {
        return f64::INFINITY;
    };
    let mut scale = 0.0f64;
    let mut worst = 0.0f64;
    for (x, y) in a.iter().zip(&b) {
        match (x.is_nan(), y.is_nan()) {
            (true, true) => continue,
            (false, false) => {}
            _ => return f64::INFINITY,
        }
        if x.is_finite() {
            scale = scale.max(x.abs());
        }
        if x != y {
            worst = worst.max((x - y).abs());
        }
    }
    if worst.is_nan() || worst.is_infinite() {
        return f64::INFINITY;
    }
    if scale == 0.0 {
        return if worst == 0.0 { 0.0 } else { f64::INFINITY };
    }
    worst / scale
}

/// Whether two elements of a buffer of kind `code` are the same: the same bytes, or two f32
/// NaNs whatever their sign and payload (a GPU stores the canonical NaN, the host whatever its
/// operand order leaves: NaN-ness is the contract, its bits are not; bf16 NaN is canonical on
/// both sides and compared by its bytes).
fn same_element(code: u8, a: &[u8], b: &[u8]) -> bool {
    let f32_nan = |v: &[u8]| match v {
        &[x, y, z, w] => f32::from_le_bytes([x, y, z, w]).is_nan(),
        _ => false,
    };
    a == b || (code == b'F' && f32_nan(a) && f32_nan(b))
}

/// "arg N element E: twin V, emulation W" of the first differing element of argument
/// `index`, read as the signature's element type (`same_element`).
fn first_difference(signature: &[u8], index: usize, twin: &[u8], emu: &[u8]) -> Option<String> {
    let code = signature.get(index).copied().unwrap_or(b'P');
    let size = match code {
        b'H' => 2,
        b'F' | b'I' | b'U' => 4,
        _ => 1,
    };
    let element = twin
        .chunks(size)
        .zip(emu.chunks(size))
        .position(|(a, b)| !same_element(code, a, b))?;
    let at = element * size;
    let value = |bytes: &[u8]| -> String {
        let raw = &bytes[at..(at + size).min(bytes.len())];
        match (code, raw) {
            (b'H', &[a, b]) => {
                let bits = u16::from_le_bytes([a, b]);
                format!("{} ({bits:#06x})", half::bf16::from_bits(bits))
            }
            (b'F', &[a, b, c, d]) => {
                let v = f32::from_le_bytes([a, b, c, d]);
                format!("{v:e} ({:#010x})", v.to_bits())
            }
            (b'I', &[a, b, c, d]) => i32::from_le_bytes([a, b, c, d]).to_string(),
            (b'U', &[a, b, c, d]) => u32::from_le_bytes([a, b, c, d]).to_string(),
            _ => format!("{raw:02x?}"),
        }
    };
    let differing = twin
        .chunks(size)
        .zip(emu.chunks(size))
        .filter(|(a, b)| !same_element(code, a, b))
        .count();
    Some(format!(
        "arg {index} element {element}: twin {}, emulation {} ({differing} of {} elements differ)",
        value(twin),
        value(emu),
        twin.len() / size
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f32_nans_are_equal_whatever_their_bits_bf16_and_integers_by_bytes() {
        let bytes = |bits: u32| bits.to_le_bytes().to_vec();
        let (quiet, negative) = (bytes(0x7fc0_0000), bytes(0xffc0_0000));
        assert!(same_element(b'F', &quiet, &negative));
        assert!(same_element(b'F', &bytes(0x7fff_ffff), &quiet));
        assert!(
            !same_element(b'F', &quiet, &bytes(0x7f80_0000)),
            "NaN is not inf"
        );
        assert!(
            !same_element(b'F', &bytes(0x8000_0000), &bytes(0)),
            "-0 is not +0"
        );
        assert!(!same_element(b'U', &quiet, &negative));
        assert!(!same_element(b'H', &[0xff, 0x7f], &[0xc0, 0xff]));
        let twin = [quiet.clone(), bytes(1)].concat();
        let emu = [negative, bytes(1)].concat();
        assert_eq!(first_difference(b"F", 0, &twin, &emu), None);
        let emu = [bytes(0x7f80_0000), bytes(1)].concat();
        assert!(first_difference(b"F", 0, &twin, &emu).is_some());
    }
}
