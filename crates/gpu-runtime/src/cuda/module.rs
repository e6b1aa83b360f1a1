//! Loaded modules and their kernels, looked up by `module::func`. A module loads from its cubin
//! where one is given (no JIT), else, or where the driver refuses the cubin (another
//! architecture, a damaged file), from its PTX, which the driver JIT-compiles.
//!
//! Invariants: the kernels of a module are the `.entry` names of its PTX, whichever image
//! loaded; a `KernelId` indexes `kernels` and stays valid while the backend lives
//! (modules are unloaded only when it drops); every kernel listed was found in its module by
//! `cuModuleGetFunction` when the module loaded.

use std::collections::HashMap;
use std::ffi::{c_void, CString};

use cudarc::driver::sys::{self, CUfunction, CUjit_option, CUmodule};

use super::driver::{describe, driver_about};
use super::ptx::ptx_entries;
use crate::error::GpuError;
use crate::types::{KernelId, ModuleImage};

/// Bytes of the JIT error log kept when PTX fails to load.
const JIT_LOG_BYTES: usize = 16 * 1024;

struct Module {
    name: String,
    raw: CUmodule,
    origin: ModuleOrigin,
}

/// Which image of a module the driver loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModuleOrigin {
    /// The cubin given with it: no JIT.
    Cubin,
    /// Its PTX, JIT-compiled: no cubin was given.
    Ptx,
    /// Its PTX, JIT-compiled, because the driver refused the cubin given with it.
    PtxAfterCubinRefused,
}

impl ModuleOrigin {
    pub fn as_str(self) -> &'static str {
        match self {
            ModuleOrigin::Cubin => "cubin",
            ModuleOrigin::Ptx => "ptx (jit)",
            ModuleOrigin::PtxAfterCubinRefused => "ptx (jit; the cubin was refused)",
        }
    }
}

pub(super) struct Kernel {
    pub(super) name: String,
    pub(super) function: CUfunction,
    /// The dynamic shared memory this kernel's launches may take: the driver's default (48 KB
    /// less the kernel's static shared memory) until a launch asks for more and
    /// `allow_shared` opts in.
    shared_allowed: u32,
}

#[derive(Default)]
pub(super) struct Modules {
    modules: Vec<Module>,
    kernels: Vec<Kernel>,
    by_name: HashMap<String, KernelId>,
}

// SAFETY: the module and function handles are plain driver handles, valid in the backend's
// context from any thread that binds it; the backend binds its context before every call.
unsafe impl Send for Modules {}

impl Modules {
    /// Loads `image`'s cubin, else its PTX (JIT-compiled by the driver), and finds each of
    /// its PTX's `.entry` kernels. Loading a module already loaded does nothing, as on the CPU backend.
    /// The backend's context must be current.
    pub(super) fn load(&mut self, image: &ModuleImage<'_>) -> Result<(), GpuError> {
        if self.modules.iter().any(|module| module.name == image.name) {
            return Ok(());
        }
        let Some(ptx) = image.ptx else {
            return Err(GpuError::Driver {
                call: "load_module",
                message: format!(
                    "module `{}` has no PTX (the CUDA backend needs it)",
                    image.name
                ),
            });
        };
        // Names are checked before the module loads, so a bad one leaves nothing to unload.
        let entries = ptx_entries(ptx)
            .into_iter()
            .map(|func| kernel_c_name(image.name, &func).map(|c_name| (func, c_name)))
            .collect::<Result<Vec<_>, _>>()?;
        let (raw, origin) = match image.cubin {
            Some(cubin) => match load_cubin(image.name, cubin) {
                Ok(raw) => (raw, ModuleOrigin::Cubin),
                Err(error) => {
                    tracing::warn!(
                        module = image.name,
                        %error,
                        "the driver refused the cubin; JIT-compiling the PTX"
                    );
                    (
                        load_ptx(image.name, ptx)?,
                        ModuleOrigin::PtxAfterCubinRefused,
                    )
                }
            },
            None => (load_ptx(image.name, ptx)?, ModuleOrigin::Ptx),
        };
        let mut found = Vec::with_capacity(entries.len());
        for (func, c_name) in entries {
            let name = format!("{}::{func}", image.name);
            // The function, and the dynamic shared memory its launches get before an opt-in.
            let looked_up = get_function(raw, c_name)
                .map_err(|error| ("cuModuleGetFunction", error))
                .and_then(|function| {
                    dynamic_shared_default(function)
                        .map(|allowed| (function, allowed))
                        .map_err(|error| ("cuFuncGetAttribute", error))
                });
            match looked_up {
                Ok((function, shared_allowed)) => found.push(Kernel {
                    name,
                    function,
                    shared_allowed,
                }),
                Err((call, error)) => {
                    // SAFETY: `raw` was loaded above and nothing refers to it yet.
                    let _ = unsafe { sys::cuModuleUnload(raw) };
                    return Err(driver_about(call, &name, error));
                }
            }
        }
        tracing::debug!(
            module = image.name,
            kernels = found.len(),
            origin = origin.as_str(),
            "cuda module loaded"
        );
        self.modules.push(Module {
            name: image.name.to_string(),
            raw,
            origin,
        });
        for kernel in found {
            let id = KernelId(self.kernels.len() as u32);
            self.by_name.insert(kernel.name.clone(), id);
            self.kernels.push(kernel);
        }
        Ok(())
    }

    pub(super) fn kernel(&self, name: &str) -> Result<KernelId, GpuError> {
        self.by_name
            .get(name)
            .copied()
            .ok_or_else(|| GpuError::UnknownKernel(name.to_string()))
    }

    pub(super) fn get(&self, id: KernelId) -> Result<&Kernel, GpuError> {
        self.kernels
            .get(id.0 as usize)
            .ok_or(GpuError::UnknownHandle {
                what: "kernel",
                id: id.0,
            })
    }

    /// Lets kernel `id`'s launches take `bytes` of dynamic shared memory: past what the driver
    /// gives it by default (48 KB a block, static and dynamic together),
    /// `cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)` once per kernel and size (a call
    /// allowed under stream capture; gemm's large qk-norm blocks stage 128 rows of a head, up to
    /// 64 KB beside 27 KB of static). More than the device allows a block (its static shared
    /// memory counted) is an error naming the kernel and the bytes.
    pub(super) fn allow_shared(&mut self, id: KernelId, bytes: u32) -> Result<(), GpuError> {
        let kernel = self
            .kernels
            .get_mut(id.0 as usize)
            .ok_or(GpuError::UnknownHandle {
                what: "kernel",
                id: id.0,
            })?;
        if bytes <= kernel.shared_allowed {
            return Ok(());
        }
        let value = i32::try_from(bytes).unwrap_or(i32::MAX);
        let attribute = sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
        // SAFETY: `function` was found in a module loaded in the backend's context, which the
        // caller has made current; the attribute takes an int.
        unsafe { sys::cuFuncSetAttribute(kernel.function, attribute, value) }
            .result()
            .map_err(|error| GpuError::Driver {
                call: "cuFuncSetAttribute",
                message: format!(
                    "kernel `{}` asks for {bytes} bytes of dynamic shared memory, past the {} it \
                     gets without opting in, and the driver refused to opt in (a block of this \
                     device may take less, its static shared memory counted): {}",
                    kernel.name,
                    kernel.shared_allowed,
                    describe(error)
                ),
            })?;
        tracing::debug!(
            kernel = kernel.name,
            bytes,
            "opted in to dynamic shared memory"
        );
        kernel.shared_allowed = bytes;
        Ok(())
    }

    /// Every kernel's `module::func` name, sorted.
    pub(super) fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.kernels.iter().map(|k| k.name.clone()).collect();
        names.sort();
        names
    }

    /// Every loaded module's name and the image it loaded from, in load order.
    pub(super) fn origins(&self) -> Vec<(String, ModuleOrigin)> {
        self.modules
            .iter()
            .map(|module| (module.name.clone(), module.origin))
            .collect()
    }

    /// Unloads every module. The backend's context must be current.
    pub(super) fn unload_all(&mut self) {
        self.by_name.clear();
        self.kernels.clear();
        for module in self.modules.drain(..) {
            // SAFETY: loaded by `load`, unloaded once; no kernel of it is referenced any more.
            if let Err(error) = unsafe { sys::cuModuleUnload(module.raw).result() } {
                tracing::warn!(module = module.name, error = %describe(error), "cuModuleUnload");
            }
        }
    }
}

/// The dynamic shared memory `function`'s launches may take before any opt-in (the driver's
/// default: 48 KB less its static shared memory).
fn dynamic_shared_default(function: CUfunction) -> Result<u32, cudarc::driver::DriverError> {
    let mut value: std::ffi::c_int = 0;
    let attribute = sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
    // SAFETY: `function` was just found in a loaded module of the current context; the
    // attribute is an int written to `value`.
    unsafe { sys::cuFuncGetAttribute(&mut value, attribute, function) }.result()?;
    Ok(value.max(0) as u32)
}

/// `cuModuleLoadData` on a cubin (an ELF image the driver loads without JIT).
fn load_cubin(module: &str, cubin: &[u8]) -> Result<CUmodule, GpuError> {
    // An ELF image starts with its magic; anything else is refused here, not by the driver.
    if !cubin.starts_with(b"\x7fELF") {
        return Err(GpuError::Driver {
            call: "cuModuleLoadData",
            message: format!("module `{module}`: the cubin is not an ELF image"),
        });
    }
    // The driver reads the image in place; an 8-byte aligned copy satisfies its ELF reader.
    let mut aligned = vec![0u64; cubin.len().div_ceil(8)];
    // SAFETY: `aligned` holds at least `cubin.len()` bytes; the two do not overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(cubin.as_ptr(), aligned.as_mut_ptr().cast(), cubin.len())
    };
    let mut raw: CUmodule = std::ptr::null_mut();
    // SAFETY: `aligned` holds the whole image and outlives the call.
    unsafe { sys::cuModuleLoadData(&mut raw, aligned.as_ptr().cast()) }
        .result()
        .map(|()| raw)
        .map_err(|error| GpuError::Driver {
            call: "cuModuleLoadData",
            message: format!("module `{module}` (cubin): {}", describe(error)),
        })
}

/// `cuModuleLoadDataEx` on NUL-terminated PTX, with the JIT error log in the error.
fn load_ptx(module: &str, ptx: &str) -> Result<CUmodule, GpuError> {
    let text = CString::new(ptx).map_err(|_| GpuError::Driver {
        call: "cuModuleLoadDataEx",
        message: format!("module `{module}`: the PTX contains a NUL byte"),
    })?;
    let mut log = vec![0u8; JIT_LOG_BYTES];
    let mut options = [
        CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
        CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
    ];
    // The size option is passed by value in the pointer slot, as the driver API specifies.
    let mut values: [*mut c_void; 2] = [log.as_mut_ptr().cast(), JIT_LOG_BYTES as *mut c_void];
    let mut raw: CUmodule = std::ptr::null_mut();
    // SAFETY: `text` is NUL-terminated PTX; `options` and `values` hold two matching entries;
    // `log` outlives the call and has the size given.
    let result = unsafe {
        sys::cuModuleLoadDataEx(
            &mut raw,
            text.as_ptr().cast(),
            options.len() as u32,
            options.as_mut_ptr(),
            values.as_mut_ptr(),
        )
    }
    .result();
    match result {
        Ok(()) => Ok(raw),
        Err(error) => {
            let end = log.iter().position(|b| *b == 0).unwrap_or(log.len());
            let jit_log = String::from_utf8_lossy(&log[..end]);
            let jit_log = jit_log.trim();
            Err(GpuError::Driver {
                call: "cuModuleLoadDataEx",
                message: if jit_log.is_empty() {
                    format!("module `{module}`: {}", describe(error))
                } else {
                    format!("module `{module}`: {}; JIT log: {jit_log}", describe(error))
                },
            })
        }
    }
}

/// A kernel's name as `cuModuleGetFunction` takes it; a NUL byte in it is an error naming the
/// kernel, not a panic (the name comes from the caller's PTX).
fn kernel_c_name(module: &str, func: &str) -> Result<CString, GpuError> {
    CString::new(func).map_err(|_| GpuError::Driver {
        call: "cuModuleGetFunction",
        message: format!(
            "kernel `{module}::{}`: the name contains a NUL byte",
            func.escape_debug()
        ),
    })
}

fn get_function(
    module: CUmodule,
    name: CString,
) -> Result<CUfunction, cudarc::driver::DriverError> {
    // SAFETY: `module` is a loaded module; `name` is NUL-terminated.
    unsafe { cudarc::driver::result::module::get_function(module, name) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kernel_name_with_a_nul_is_an_error_naming_the_kernel() {
        let error = kernel_c_name("gemv", "lin\0ear").unwrap_err().to_string();
        assert_eq!(
            error,
            "cuModuleGetFunction: kernel `gemv::lin\\0ear`: the name contains a NUL byte"
        );
    }

    #[test]
    fn a_plain_kernel_name_converts() {
        let name = kernel_c_name("gemv", "linear").unwrap();
        assert_eq!(name.as_bytes(), b"linear");
    }
}
