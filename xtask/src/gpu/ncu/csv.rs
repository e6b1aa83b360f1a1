//! Reading ncu's CSV: quoted fields, the details and raw pages, units to bytes and seconds.

/// One profiled kernel launch.
#[derive(Debug, Clone, PartialEq)]
pub struct Profiled {
    /// ncu's launch ID.
    pub id: u64,
    /// The kernel's function name.
    pub name: String,
    pub seconds: f64,
    pub bytes_read: f64,
    pub bytes_written: f64,
}

impl Profiled {
    pub fn dram_bytes(&self) -> f64 {
        self.bytes_read + self.bytes_written
    }
}

const TIME: &str = "gpu__time_duration.sum";
const READ: &str = "dram__bytes_read.sum";
const WRITE: &str = "dram__bytes_write.sum";

/// The fields of one CSV line: comma-separated, optionally double-quoted (`""` inside quotes
/// is a quote).
pub fn fields(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut chars = line.trim_end_matches(['\r', '\n']).chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                field.push('"');
                chars.next();
            }
            ('"', _) => quoted = !quoted,
            (',', false) => out.push(std::mem::take(&mut field)),
            (c, _) => field.push(c),
        }
    }
    out.push(field);
    out
}

/// A metric value in base units (bytes, seconds) from ncu's value and unit.
pub fn in_base_units(value: &str, unit: &str) -> Result<f64, String> {
    let number: f64 = value
        .replace(',', "")
        .trim()
        .parse()
        .map_err(|_| format!("`{value}` is not a number"))?;
    let scale = match unit.trim() {
        "byte" | "B" => 1.0,
        "Kbyte" | "KB" => 1e3,
        "Mbyte" | "MB" => 1e6,
        "Gbyte" | "GB" => 1e9,
        "Tbyte" | "TB" => 1e12,
        "Kibyte" | "KiB" => 1024.0,
        "Mibyte" | "MiB" => 1024.0 * 1024.0,
        "Gibyte" | "GiB" => 1024.0 * 1024.0 * 1024.0,
        "nsecond" | "ns" => 1e-9,
        "usecond" | "us" => 1e-6,
        "msecond" | "ms" => 1e-3,
        "second" | "s" => 1.0,
        other => return Err(format!("unknown unit `{other}`")),
    };
    Ok(number * scale)
}

/// Every kernel of ncu's CSV `text`, in ID order.
pub fn parse(text: &str) -> Result<Vec<Profiled>, String> {
    let mut lines = text.lines().enumerate();
    let header = loop {
        match lines.next() {
            Some((_, line)) if line.starts_with("\"ID\"") || line.starts_with("ID,") => {
                break fields(line)
            }
            Some(_) => continue,
            None => return Err("no ncu CSV header (a line starting with \"ID\")".into()),
        }
    };
    let column = |name: &str| header.iter().position(|h| h == name);
    let keys = KeyColumns {
        id: column("ID").ok_or("no `ID` column")?,
        name: column("Kernel Name").ok_or("no `Kernel Name` column")?,
    };
    let mut kernels: Vec<Profiled> = Vec::new();
    match (
        column("Metric Name"),
        column("Metric Unit"),
        column("Metric Value"),
    ) {
        (Some(metric), Some(unit), Some(value)) => {
            details_page(lines, keys, [metric, unit, value], &mut kernels)?
        }
        _ => {
            // The raw page: a column per metric, their units on the next line.
            let columns: Vec<(usize, &str)> = [TIME, READ, WRITE]
                .iter()
                .filter_map(|m| column(m).map(|c| (c, *m)))
                .collect();
            if columns.len() != 3 {
                return Err(format!(
                    "neither the details page (`Metric Name` column) nor the raw page with \
                     columns {TIME}, {READ}, {WRITE}"
                ));
            }
            raw_page(lines, keys, &columns, &mut kernels)?
        }
    }
    if let Some(k) = kernels
        .iter()
        .find(|k| k.seconds.is_nan() || k.bytes_read.is_nan() || k.bytes_written.is_nan())
    {
        return Err(format!(
            "kernel ID {} ({}) lacks one of {TIME}, {READ}, {WRITE}",
            k.id, k.name
        ));
    }
    kernels.sort_by_key(|k| k.id);
    Ok(kernels)
}

/// The columns that name a kernel launch: its ID and its kernel's name.
#[derive(Clone, Copy)]
struct KeyColumns {
    id: usize,
    name: usize,
}

/// The details page: one line per (kernel, metric), `[Metric Name, Metric Unit, Metric
/// Value]` at `[metric, unit, value]`.
fn details_page<'t>(
    lines: impl Iterator<Item = (usize, &'t str)>,
    keys: KeyColumns,
    [metric, unit, value]: [usize; 3],
    kernels: &mut Vec<Profiled>,
) -> Result<(), String> {
    for (at, line) in lines {
        if line.trim().is_empty() || line.starts_with("==") {
            continue;
        }
        let f = fields(line);
        let i = kernel_index(kernels, &f, at, keys)?;
        let metric = f.get(metric).map(String::as_str).unwrap_or("");
        if [TIME, READ, WRITE].contains(&metric) {
            let unit = f.get(unit).map(String::as_str).unwrap_or("");
            let v = in_base_units(f.get(value).map(String::as_str).unwrap_or(""), unit)
                .map_err(|e| format!("line {}: {metric}: {e}", at + 1))?;
            set_metric(&mut kernels[i], metric, v);
        }
    }
    Ok(())
}

/// The raw page: a line per kernel with a column per metric (`columns`), their units on the
/// line after the header.
fn raw_page<'t>(
    mut lines: impl Iterator<Item = (usize, &'t str)>,
    keys: KeyColumns,
    columns: &[(usize, &str)],
    kernels: &mut Vec<Profiled>,
) -> Result<(), String> {
    let units = match lines.next() {
        Some((_, line)) => fields(line),
        None => return Err("the raw page has no units line".into()),
    };
    for (at, line) in lines {
        if line.trim().is_empty() || line.starts_with("==") {
            continue;
        }
        let f = fields(line);
        let i = kernel_index(kernels, &f, at, keys)?;
        for &(c, metric) in columns {
            let unit = units.get(c).map(String::as_str).unwrap_or("");
            let v = in_base_units(f.get(c).map(String::as_str).unwrap_or(""), unit)
                .map_err(|e| format!("line {}: {metric}: {e}", at + 1))?;
            set_metric(&mut kernels[i], metric, v);
        }
    }
    Ok(())
}

/// The index in `kernels` of the launch line `f` (at line `at`) names, added when new.
fn kernel_index(
    kernels: &mut Vec<Profiled>,
    f: &[String],
    at: usize,
    keys: KeyColumns,
) -> Result<usize, String> {
    let field = |i: usize| {
        f.get(i)
            .map(String::as_str)
            .ok_or_else(|| format!("line {}: {} fields, no column {i}", at + 1, f.len()))
    };
    let launch: u64 = field(keys.id)?.trim().parse().map_err(|_| {
        format!(
            "line {}: ID `{}` is not a number",
            at + 1,
            field(keys.id).unwrap_or("")
        )
    })?;
    if let Some(i) = kernels.iter().position(|k| k.id == launch) {
        return Ok(i);
    }
    kernels.push(Profiled {
        id: launch,
        name: field(keys.name)?.to_string(),
        seconds: f64::NAN,
        bytes_read: f64::NAN,
        bytes_written: f64::NAN,
    });
    Ok(kernels.len() - 1)
}

/// Sets the field of `k` that `metric` measures (others are ignored).
fn set_metric(k: &mut Profiled, metric: &str, value: f64) {
    match metric {
        TIME => k.seconds = value,
        READ => k.bytes_read = value,
        WRITE => k.bytes_written = value,
        _ => {}
    }
}

/// The recorded sample the tests read (ncu's details page, written from its documented form).
#[cfg(test)]
pub fn tests_sample() -> &'static str {
    tests::DETAILS
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ncu's details page as `ncu --csv --metrics ...` prints it (ncu 2023+ columns), after
    /// the application's own output and ncu's notes.
    pub const DETAILS: &str = r#"cuda backend: NVIDIA H200, 139.8 GiB, sm_90, 132 multiprocessors
==PROF== Connected to process 4242 (/work/target/gpu-check/solder)
==PROF== Profiling "embedding" - 0: 0%....50%....100% - 1 pass
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","4242","solder","127.0.0.1","embedding","1","13","(256, 1, 1)","(8, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","Kbyte","8.19"
"0","4242","solder","127.0.0.1","embedding","1","13","(256, 1, 1)","(8, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_write.sum","byte","8,192"
"0","4242","solder","127.0.0.1","embedding","1","13","(256, 1, 1)","(8, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","2.50"
"1","4242","solder","127.0.0.1","add_norm_qkv","1","13","(256, 1, 1)","(48, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","Mbyte","12.60"
"1","4242","solder","127.0.0.1","add_norm_qkv","1","13","(256, 1, 1)","(48, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_write.sum","byte","6,144"
"1","4242","solder","127.0.0.1","add_norm_qkv","1","13","(256, 1, 1)","(48, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","4,200"
==PROF== Disconnected from process 4242
"#;

    /// The same two kernels as `--page raw --csv` prints them.
    const RAW: &str = r#""ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","dram__bytes_read.sum","dram__bytes_write.sum","gpu__time_duration.sum"
"","","","","","","","","","","","Kbyte","byte","usecond"
"0","4242","solder","127.0.0.1","embedding","1","13","(256, 1, 1)","(8, 1, 1)","0","9.0","8.19","8,192","2.50"
"1","4242","solder","127.0.0.1","add_norm_qkv","1","13","(256, 1, 1)","(48, 1, 1)","0","9.0","12,600","6144","4.2"
"#;

    fn check(kernels: &[Profiled]) {
        assert_eq!(kernels.len(), 2);
        assert_eq!(kernels[0].name, "embedding");
        assert!((kernels[0].bytes_read - 8190.0).abs() < 1e-6);
        assert!((kernels[0].bytes_written - 8192.0).abs() < 1e-6);
        assert!((kernels[0].seconds - 2.5e-6).abs() < 1e-15);
        assert_eq!(kernels[1].name, "add_norm_qkv");
        assert!((kernels[1].dram_bytes() - (12.6e6 + 6144.0)).abs() < 1.0);
        assert!((kernels[1].seconds - 4.2e-6).abs() < 1e-15);
    }

    #[test]
    fn reads_the_details_page() {
        check(&parse(DETAILS).unwrap());
    }

    #[test]
    fn reads_the_raw_page() {
        check(&parse(RAW).unwrap());
    }

    #[test]
    fn quoted_fields_keep_commas_and_quotes() {
        assert_eq!(fields(r#""a,b","c""d",e,"#), ["a,b", "c\"d", "e", ""]);
    }

    #[test]
    fn refuses_missing_metrics_units_and_headers() {
        let e = parse("hello\nworld\n").unwrap_err();
        assert!(e.contains("no ncu CSV header"), "{e}");
        let short: String = DETAILS
            .lines()
            .filter(|l| !(l.starts_with("\"1\"") && l.contains("gpu__time")))
            .map(|l| format!("{l}\n"))
            .collect();
        let e = parse(&short).unwrap_err();
        assert!(e.contains("kernel ID 1 (add_norm_qkv) lacks"), "{e}");
        let e = parse(&DETAILS.replace("\"nsecond\"", "\"cycle\"")).unwrap_err();
        assert!(e.contains("unknown unit `cycle`"), "{e}");
        let e = parse(&DETAILS.replace("\"2.50\"", "\"n/a\"")).unwrap_err();
        assert!(e.contains("`n/a` is not a number"), "{e}");
    }
}
