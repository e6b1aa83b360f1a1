//! Every file xtask opens or writes itself.
//!
//! Reading: a regular file (not a device, FIFO or folder) under a size cap, refused with an
//! error naming the path before anything is read. Configs go through `ModelConfig::from_file`,
//! which makes the same check.
//!
//! Writing (`write_output`, `partial_dir`): every output path of every command.
//! Invariants:
//! - an output is never an input of the same run (`Inputs`): the same path, a symbolic or
//!   hard link to it (compared by canonical path and by device and inode), is refused by name
//!   before anything is written;
//! - an existing output must be a regular file: a symbolic link, device, FIFO or folder at the
//!   output path is refused, never followed or replaced;
//! - bytes go to a temporary beside the target with an unpredictable name (process id and 64
//!   bits from the OS-seeded `RandomState`), created with `O_CREAT | O_EXCL`
//!   (`create_new`), which never follows a symbolic link (POSIX), then are synced and renamed
//!   over the target: a reader sees the old file or the whole new one, and a failed write
//!   removes its temporary.

use std::hash::{BuildHasher as _, Hasher as _};
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};

use solder_config::ModelConfig;

/// JSON and TOML (configs, reports, rules): the shipped ones are kilobytes.
pub const TEXT_CAP: u64 = 64 << 20;
/// Golden logits files, read whole (`T * V * 4 * 2` bytes: 64 tokens of a 150k vocabulary
/// are 77 MB).
pub const GOLDEN_CAP: u64 = 1 << 30;

/// The size of `path`, which must be a regular file of at most `cap` bytes.
pub fn check_regular(path: &Path, cap: u64) -> Result<u64, String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(format!("{}: not a regular file", path.display()));
    }
    if meta.len() > cap {
        return Err(format!(
            "{}: {} bytes, more than the {cap} xtask reads from such a file",
            path.display(),
            meta.len()
        ));
    }
    Ok(meta.len())
}

/// The bytes of `path` (checked by `check_regular`; one byte past the cap is refused too,
/// for a file that grows while read).
pub fn read_capped(path: &Path, cap: u64) -> Result<Vec<u8>, String> {
    check_regular(path, cap)?;
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(cap + 1).read_to_end(&mut bytes))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if bytes.len() as u64 > cap {
        return Err(format!("{}: more than {cap} bytes", path.display()));
    }
    Ok(bytes)
}

pub fn read_text(path: &Path) -> Result<String, String> {
    String::from_utf8(read_capped(path, TEXT_CAP)?)
        .map_err(|e| format!("{}: not UTF-8: {e}", path.display()))
}

/// `ModelConfig::from_file`, which itself reads only a regular file under its own cap
/// (`solder_config::MAX_CONFIG_BYTES`), with its error as text.
pub fn model_config(path: &Path) -> Result<ModelConfig, String> {
    ModelConfig::from_file(path).map_err(|e| e.to_string())
}

/// A file a run reads, as given and as resolved.
struct Input {
    given: PathBuf,
    canonical: Option<PathBuf>,
    /// (device, inode): the same file under any name, hard links included.
    id: Option<(u64, u64)>,
}

/// The files a run reads: what `write_output` refuses to write over.
#[derive(Default)]
pub struct Inputs {
    files: Vec<Input>,
}

impl Inputs {
    /// `path` is read by this run (a path that does not exist is kept by name).
    pub fn add(&mut self, path: &Path) {
        self.files.push(Input {
            given: path.to_path_buf(),
            canonical: std::fs::canonicalize(path).ok(),
            id: file_id(path),
        });
    }

    /// A checkpoint folder: its `config.json`, index and every `*.safetensors` and `*.json`
    /// directly inside (shards, goldens, generation config).
    pub fn add_checkpoint(&mut self, dir: &Path) {
        self.add(&dir.join("config.json"));
        self.add(&dir.join("model.safetensors"));
        if let Ok(entries) = std::fs::read_dir(dir) {
            for entry in entries.flatten() {
                let path = entry.path();
                if path
                    .extension()
                    .is_some_and(|x| x == "safetensors" || x == "json")
                {
                    self.add(&path);
                }
            }
        }
    }

    /// Refuses `out` when it is one of the inputs (by path, link or inode), or exists as
    /// anything but a regular file.
    pub fn check_output(&self, out: &Path) -> Result<(), String> {
        match std::fs::symlink_metadata(out) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("output {}: {e}", out.display())),
            Ok(meta) if meta.file_type().is_symlink() => {
                return Err(format!(
                    "output {}: is a symbolic link; refusing to follow or replace it",
                    out.display()
                ))
            }
            Ok(meta) if !meta.is_file() => {
                return Err(format!(
                    "output {}: exists and is not a regular file; refusing to replace it",
                    out.display()
                ))
            }
            Ok(_) => {}
        }
        let out_id = file_id(out);
        let out_canonical = canonical_beside(out);
        for input in &self.files {
            let same_file = out_id.is_some() && out_id == input.id;
            let same_path = out_canonical.is_some() && out_canonical == input.canonical;
            if same_file || same_path || out == input.given {
                return Err(format!(
                    "output {} is an input of this run ({}); refusing to write over it",
                    out.display(),
                    input.given.display()
                ));
            }
        }
        Ok(())
    }
}

/// (device, inode) of the file `path` names (links followed), if it exists.
fn file_id(path: &Path) -> Option<(u64, u64)> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt as _;
        std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        None
    }
}

/// `out` with its folder resolved (the file itself need not exist).
fn canonical_beside(out: &Path) -> Option<PathBuf> {
    let name = out.file_name()?;
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    Some(std::fs::canonicalize(parent).ok()?.join(name))
}

/// 64 unpredictable bits: std's `RandomState` keys come from the OS's random source.
fn unpredictable() -> u64 {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    hasher.finish()
}

/// The folder `path` sits in (`.` for a bare name).
fn folder_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Writes `bytes` to `out` atomically, refusing an output that is one of `inputs` (see the
/// module's invariants).
pub fn write_output(out: &Path, bytes: &[u8], inputs: &Inputs) -> Result<(), String> {
    inputs.check_output(out)?;
    let name = out
        .file_name()
        .ok_or_else(|| format!("output {}: names no file", out.display()))?
        .to_string_lossy()
        .into_owned();
    let folder = folder_of(out);
    let (tmp, mut file) = create_temporary(&folder, &name)?;
    let written = file
        .write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| format!("{}: {e}", tmp.display()))
        .and_then(|()| {
            std::fs::rename(&tmp, out).map_err(|e| format!("output {}: {e}", out.display()))
        });
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written?;
    // The rename itself is durable once the folder is synced (best effort: not every
    // platform opens folders).
    if let Ok(dir) = std::fs::File::open(&folder) {
        let _ = dir.sync_all();
    }
    Ok(())
}

/// A new file `.NAME.tmp-PID-RANDOM` in `folder`, created exclusively (never through a link).
fn create_temporary(folder: &Path, name: &str) -> Result<(PathBuf, std::fs::File), String> {
    let mut last = None;
    for _ in 0..16 {
        let tmp = folder.join(format!(
            ".{name}.tmp-{}-{:016x}",
            std::process::id(),
            unpredictable()
        ));
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o644);
        match options.open(&tmp) {
            Ok(file) => return Ok((tmp, file)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(tmp),
            Err(e) => return Err(format!("{}: {e}", tmp.display())),
        }
    }
    Err(format!(
        "{}: 16 temporary names taken in a row; refusing to write",
        last.map_or_else(|| folder.display().to_string(), |p| p.display().to_string())
    ))
}

/// An unused, unpredictable name beside `target` (`.NAME.tmp-PID-RANDOM`) for a tool that
/// writes its own output (g++, ptxas), to be renamed over `target`.
pub fn temporary_beside(target: &Path) -> PathBuf {
    let name = target
        .file_name()
        .map_or_else(|| "output".into(), |n| n.to_string_lossy().into_owned());
    folder_of(target).join(format!(
        ".{name}.tmp-{}-{:016x}",
        std::process::id(),
        unpredictable()
    ))
}

/// A new, empty folder `.LEAF.partial-PID-RANDOM` beside `target`, to be filled and renamed
/// over it. Partial folders of `target` left by a process that no longer runs (a killed
/// `bench --save`) are removed first, each named on stderr.
pub fn partial_dir(target: &Path) -> Result<PathBuf, String> {
    let leaf = target
        .file_name()
        .ok_or_else(|| format!("{}: names no folder", target.display()))?
        .to_string_lossy()
        .into_owned();
    let folder = folder_of(target);
    remove_stale_partials(&folder, &leaf);
    let dir = folder.join(format!(
        ".{leaf}.partial-{}-{:016x}",
        std::process::id(),
        unpredictable()
    ));
    // mkdir fails on any existing name, a link included.
    std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(dir)
}

/// Removes `.LEAF.partial-PID[-RANDOM]` folders in `folder` whose process is gone (Linux:
/// no `/proc/PID`; elsewhere nothing can be told, and nothing is removed).
fn remove_stale_partials(folder: &Path, leaf: &str) {
    if !Path::new("/proc/self").exists() {
        return;
    }
    let prefix = format!(".{leaf}.partial-");
    let Ok(entries) = std::fs::read_dir(folder) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(&prefix) else {
            continue;
        };
        let Ok(pid) = rest.split('-').next().unwrap_or_default().parse::<u32>() else {
            continue;
        };
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if is_dir && pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let path = entry.path();
            match std::fs::remove_dir_all(&path) {
                Ok(()) => eprintln!(
                    "removed {}, left by process {pid}, which no longer runs",
                    path.display()
                ),
                Err(e) => eprintln!("warning: {}: {e}", path.display()),
            }
        }
    }
}

/// A fresh, empty folder under the temp dir for one test of `owner` (this process's own).
#[cfg(test)]
pub(crate) fn scratch_dir(owner: &str, name: &str) -> PathBuf {
    let dir = std::env::temp_dir()
        .join(format!("xtask-{owner}-{}", std::process::id()))
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_and_folders_are_refused_by_path() {
        let e = model_config(Path::new("/dev/zero")).unwrap_err();
        assert!(
            e.contains("/dev/zero") && e.contains("not a regular file"),
            "{e}"
        );
        let e = read_text(&std::env::temp_dir()).unwrap_err();
        assert!(e.contains("not a regular file"), "{e}");
    }

    fn scratch(name: &str) -> PathBuf {
        scratch_dir("files", name)
    }

    /// Issue 19.2: `--json D/model.safetensors` replaced the checkpoint with the report.
    #[test]
    fn an_output_that_is_an_input_is_refused_by_path_link_and_inode() {
        let dir = scratch("inputs");
        std::fs::write(dir.join("config.json"), "{}").unwrap();
        std::fs::write(dir.join("model.safetensors"), "weights").unwrap();
        std::fs::write(dir.join("rules.toml"), "rules").unwrap();
        let mut inputs = Inputs::default();
        inputs.add_checkpoint(&dir);
        inputs.add(&dir.join("rules.toml"));
        std::fs::hard_link(dir.join("model.safetensors"), dir.join("hard")).unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(dir.join("rules.toml"), dir.join("soft")).unwrap();
        let sub = dir.join("sub");
        std::fs::create_dir(&sub).unwrap();
        for out in [
            dir.join("model.safetensors"),
            dir.join("config.json"),
            dir.join("rules.toml"),
            sub.join("../model.safetensors"),
            dir.join("hard"),
            #[cfg(unix)]
            dir.join("soft"),
        ] {
            let e = write_output(&out, b"report", &inputs).unwrap_err();
            assert!(
                e.contains("is an input of this run") || e.contains("symbolic link"),
                "{}: {e}",
                out.display()
            );
        }
        assert_eq!(
            std::fs::read(dir.join("model.safetensors")).unwrap(),
            b"weights"
        );
        assert_eq!(std::fs::read(dir.join("rules.toml")).unwrap(), b"rules");
        assert_eq!(std::fs::read(dir.join("config.json")).unwrap(), b"{}");
        // Anything else is written, and no temporary is left beside it.
        write_output(&dir.join("report.json"), b"report", &inputs).unwrap();
        assert_eq!(std::fs::read(dir.join("report.json")).unwrap(), b"report");
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".tmp"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Issue 19.2: the temporary was `R.json.tmp`, followed through a planted link.
    #[cfg(unix)]
    #[test]
    fn a_planted_link_never_receives_the_report() {
        let dir = scratch("planted");
        std::fs::write(dir.join("victim"), "precious").unwrap();
        for planted in ["R.json.tmp", ".R.json.tmp"] {
            std::os::unix::fs::symlink(dir.join("victim"), dir.join(planted)).unwrap();
        }
        write_output(&dir.join("R.json"), b"report", &Inputs::default()).unwrap();
        assert_eq!(std::fs::read(dir.join("victim")).unwrap(), b"precious");
        assert_eq!(std::fs::read(dir.join("R.json")).unwrap(), b"report");
        // A link at the output itself is refused, its target untouched.
        std::os::unix::fs::symlink(dir.join("victim"), dir.join("out.json")).unwrap();
        let e = write_output(&dir.join("out.json"), b"report", &Inputs::default()).unwrap_err();
        assert!(e.contains("symbolic link"), "{e}");
        assert_eq!(std::fs::read(dir.join("victim")).unwrap(), b"precious");
        // So is a folder or a device.
        let e = write_output(&dir, b"report", &Inputs::default()).unwrap_err();
        assert!(e.contains("not a regular file"), "{e}");
        let e = write_output(Path::new("/dev/null"), b"x", &Inputs::default()).unwrap_err();
        assert!(e.contains("not a regular file"), "{e}");
        // Two temporaries never share a name.
        assert_ne!(
            temporary_beside(&dir.join("a")),
            temporary_beside(&dir.join("a"))
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Issue 19.7: a killed `bench --save` left `.DIR.partial-PID` folders nothing removed.
    #[test]
    fn a_dead_process_partial_folder_is_removed_by_the_next_save() {
        let dir = scratch("partials");
        let target = dir.join("model");
        // Above Linux's largest pid (2^22): no process runs under it.
        let stale = dir.join(".model.partial-4194999");
        let stale_new = dir.join(".model.partial-4194999-00000000deadbeef");
        let mine = dir.join(format!(".model.partial-{}", std::process::id()));
        let other = dir.join(".other.partial-4194999");
        for d in [&stale, &stale_new, &mine, &other] {
            std::fs::create_dir(d).unwrap();
        }
        std::fs::write(stale.join("model.safetensors"), "half").unwrap();
        let fresh = partial_dir(&target).unwrap();
        assert!(fresh.is_dir());
        let on_linux = Path::new("/proc/self").exists();
        assert_eq!(stale.exists(), !on_linux);
        assert_eq!(stale_new.exists(), !on_linux);
        assert!(
            mine.exists() && other.exists(),
            "only a dead process's own kind goes"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_file_over_the_cap_is_refused() {
        let path = std::env::temp_dir().join(format!("xtask-files-{}.json", std::process::id()));
        let file = std::fs::File::create(&path).unwrap();
        file.set_len(TEXT_CAP + 1).unwrap();
        let e = read_text(&path).unwrap_err();
        std::fs::remove_file(&path).unwrap();
        assert!(e.contains("more than"), "{e}");
    }
}
