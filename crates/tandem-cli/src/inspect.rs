//! `tandem inspect`: a model file's metadata and tensor table, with totals per type.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use tandem_gguf::{GgmlType, GgufFile};

pub fn render(file: &GgufFile, all_tensors: bool) -> String {
    let mut out = String::new();
    let path = file.path().map(|p| p.display().to_string()).unwrap_or_default();
    let _ = writeln!(
        out,
        "{path}: GGUF v{}, {} bytes, {} metadata keys, {} tensors, alignment {}, data at byte {}",
        file.version,
        file.bytes().len(),
        file.metadata().len(),
        file.tensors().len(),
        file.alignment,
        file.data_offset
    );
    let _ = writeln!(out, "\nmetadata:");
    let key_width = file.metadata().iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (key, value) in file.metadata() {
        let mut shown = value.summary(6);
        if shown.len() > 160 {
            let cut = shown
                .char_indices()
                .take_while(|(i, _)| *i < 157)
                .last()
                .map_or(0, |(i, c)| i + c.len_utf8());
            shown.truncate(cut);
            shown.push('…');
        }
        let shown = shown.replace('\n', "\\n");
        let _ = writeln!(
            out,
            "  {key:key_width$}  {:<6}  {shown}",
            value.value_type().to_string()
        );
    }

    let _ = writeln!(out, "\ntensors:");
    let name_width = file.tensors().iter().map(|t| t.name.len()).max().unwrap_or(4).max(4);
    let _ = writeln!(
        out,
        "  {:name_width$}  {:<7}  {:<22}  {:>12}",
        "name", "type", "shape", "bytes"
    );
    let shown = if all_tensors { usize::MAX } else { 40 };
    for t in file.tensors().iter().take(shown) {
        let shape = format!("{:?}", t.dims);
        let _ = writeln!(
            out,
            "  {:name_width$}  {:<7}  {:<22}  {:>12}",
            t.name,
            t.ty.name(),
            shape,
            t.size
        );
    }
    if file.tensors().len() > shown {
        let _ = writeln!(
            out,
            "  … {} more (--all-tensors lists them)",
            file.tensors().len() - shown
        );
    }

    let mut totals: BTreeMap<GgmlType, (usize, u64, u64)> = BTreeMap::new();
    for t in file.tensors() {
        let e = totals.entry(t.ty).or_default();
        e.0 += 1;
        e.1 += t.n_elements();
        e.2 += t.size;
    }
    let _ = writeln!(out, "\ntotals per type:");
    let _ = writeln!(
        out,
        "  {:<7}  {:>7}  {:>14}  {:>14}",
        "type", "tensors", "elements", "bytes"
    );
    let (mut n, mut elems, mut bytes) = (0, 0, 0);
    for (ty, (count, e, b)) in &totals {
        let _ = writeln!(out, "  {:<7}  {:>7}  {:>14}  {:>14}", ty.name(), count, e, b);
        n += count;
        elems += e;
        bytes += b;
    }
    let _ = writeln!(out, "  {:<7}  {:>7}  {:>14}  {:>14}", "all", n, elems, bytes);
    out
}
