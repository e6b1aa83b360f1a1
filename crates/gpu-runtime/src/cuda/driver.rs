//! Finding the CUDA driver library, and turning driver errors into [`GpuError`]s.
//!
//! Invariant: no cudarc driver call is made before [`driver_library_loads`] returned true —
//! with dynamic loading, cudarc panics on its first call when the library is absent.

use cudarc::driver::sys::CUresult;
use cudarc::driver::DriverError;

use crate::error::GpuError;

/// The library names cudarc searches for the driver (`libcuda.so`, `libcuda.so.1`, ...).
pub fn driver_library_names() -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for candidate in ["cuda", "nvcuda"]
        .iter()
        .flat_map(|name| cudarc::get_lib_name_candidates(name))
    {
        if !names.contains(&candidate) {
            names.push(candidate);
        }
    }
    names
}

/// Whether the CUDA driver library loads on this machine; when false, any driver call panics.
pub fn driver_library_loads() -> bool {
    // SAFETY: only tries to open the library by each candidate name (libloading), runs no
    // driver code beyond the library's initialisers.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// `GpuError::NoDriver` naming the libraries that were looked for.
pub(super) fn no_driver() -> GpuError {
    GpuError::NoDriver(format!(
        "none of the driver libraries {} could be opened (is an NVIDIA driver installed, and \
         is its directory on LD_LIBRARY_PATH?)",
        driver_library_names().join(", ")
    ))
}

/// `CUDA_ERROR_NAME: description` of a driver error.
pub(super) fn describe(error: DriverError) -> String {
    let description = error
        .error_string()
        .map(|text| text.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "no description".to_string());
    format!("{:?}: {description}", error.0)
}

/// A driver call's error, naming the call.
pub(super) fn driver(call: &'static str, error: DriverError) -> GpuError {
    GpuError::Driver {
        call,
        message: describe(error),
    }
}

/// A driver call's error, naming the call and the object it was about (kernel, module).
pub(super) fn driver_about(call: &'static str, what: &str, error: DriverError) -> GpuError {
    GpuError::Driver {
        call,
        message: format!("{what}: {}", describe(error)),
    }
}

/// Stream-capture rule violations become `GpuError::Capture`; anything else a driver error.
pub(super) fn capture_or_driver(call: &'static str, what: &str, error: DriverError) -> GpuError {
    if is_capture_error(error.0) {
        GpuError::Capture(format!("{call} ({what}): {}", describe(error)))
    } else {
        driver_about(call, what, error)
    }
}

fn is_capture_error(code: CUresult) -> bool {
    matches!(
        code,
        CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
            | CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
            | CUresult::CUDA_ERROR_STREAM_CAPTURE_MERGE
            | CUresult::CUDA_ERROR_STREAM_CAPTURE_UNMATCHED
            | CUresult::CUDA_ERROR_STREAM_CAPTURE_UNJOINED
            | CUresult::CUDA_ERROR_STREAM_CAPTURE_ISOLATION
            | CUresult::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
            | CUresult::CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD
            | CUresult::CUDA_ERROR_CAPTURED_EVENT
            | CUresult::CUDA_ERROR_ILLEGAL_STATE
    )
}
