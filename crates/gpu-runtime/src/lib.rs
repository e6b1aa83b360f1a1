//! solder's GPU runtime: the `GpuBackend` trait and its backends (issue 3 and 4).
