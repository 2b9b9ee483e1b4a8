//! Truncated, mutated and hand-crafted hostile files: each must give an error (or, for harmless
//! mutations, a valid parse) and never a panic or an allocation sized by an unchecked count.

use tandem_gguf::{GgmlType, GgufError, GgufFile, GgufWriter, Value};

fn valid_file() -> (Vec<u8>, u64) {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", "llama").unwrap();
    w.add_metadata(
        "tokenizer.ggml.tokens",
        tandem_gguf::Array::String(vec!["a".into(), "bc".into()]),
    )
    .unwrap();
    w.add_metadata("x.scores", tandem_gguf::Array::F32(vec![1.0, 2.0]))
        .unwrap();
    w.add_metadata("x.n", Value::U32(7)).unwrap();
    w.add_tensor("w", &[32, 2], GgmlType::Q8_0).unwrap();
    w.add_tensor("v", &[3], GgmlType::F32).unwrap();
    let data_end_rel = w.tensors().iter().map(|t| t.offset + t.size).max().unwrap();
    let bytes = w
        .write_all(Vec::new(), |t| Box::leak(vec![1u8; t.size as usize].into_boxed_slice()))
        .unwrap();
    let f = GgufFile::from_bytes(bytes.clone()).unwrap();
    (bytes, f.data_offset + data_end_rel)
}

#[test]
fn every_truncation_before_the_last_tensor_byte_is_an_error() {
    let (bytes, data_end) = valid_file();
    assert!(data_end > 150, "the sample must be big enough to give many cases");
    let mut cases = 0;
    for len in 0..bytes.len() {
        let r = GgufFile::from_bytes(bytes[..len].to_vec());
        if (len as u64) < data_end {
            let e = r.expect_err(&format!("truncated to {len} bytes parsed"));
            assert!(!e.to_string().is_empty());
            cases += 1;
        }
    }
    assert!(cases >= 200, "{cases} truncations");
}

/// xorshift: a fixed sequence, so a failure reproduces.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

#[test]
fn random_mutations_never_panic() {
    let (bytes, _) = valid_file();
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut errors = 0;
    for _ in 0..2000 {
        let mut m = bytes.clone();
        for _ in 0..1 + next(&mut state) % 4 {
            let at = (next(&mut state) % m.len() as u64) as usize;
            m[at] = match next(&mut state) % 3 {
                0 => next(&mut state) as u8,
                1 => 0xFF,
                _ => m[at] ^ (1 << (next(&mut state) % 8)),
            };
        }
        if GgufFile::from_bytes(m).is_err() {
            errors += 1;
        }
    }
    assert!(errors > 200, "only {errors} mutations were caught");
}

fn header(version: u32, tensors: u64, kvs: u64) -> Vec<u8> {
    let mut h = b"GGUF".to_vec();
    h.extend_from_slice(&version.to_le_bytes());
    h.extend_from_slice(&tensors.to_le_bytes());
    h.extend_from_slice(&kvs.to_le_bytes());
    h
}

fn string(h: &mut Vec<u8>, s: &[u8]) {
    h.extend_from_slice(&(s.len() as u64).to_le_bytes());
    h.extend_from_slice(s);
}

fn kv(h: &mut Vec<u8>, key: &str, ty: u32, payload: &[u8]) {
    string(h, key.as_bytes());
    h.extend_from_slice(&ty.to_le_bytes());
    h.extend_from_slice(payload);
}

fn err_of(bytes: Vec<u8>) -> String {
    match GgufFile::from_bytes(bytes) {
        Ok(_) => panic!("hostile file parsed"),
        Err(e) => e.to_string(),
    }
}

fn tensor_file(n_dims: u32, dims: &[u64], ty: u32, offset: u64, data: usize) -> Vec<u8> {
    let mut h = header(3, 1, 0);
    string(&mut h, b"blk.0.w");
    h.extend_from_slice(&n_dims.to_le_bytes());
    for d in dims {
        h.extend_from_slice(&d.to_le_bytes());
    }
    h.extend_from_slice(&ty.to_le_bytes());
    h.extend_from_slice(&offset.to_le_bytes());
    while !h.len().is_multiple_of(32) {
        h.push(0);
    }
    h.extend(std::iter::repeat_n(0u8, data));
    h
}

#[test]
fn hostile_headers_get_named_errors() {
    assert!(err_of(b"GGUX\x03\0\0\0".to_vec()).contains("magic"));
    assert!(err_of(header(1, 0, 0)).contains("version 1"));
    assert!(err_of(header(3, 0, u64::MAX)).contains("kv_count"));
    assert!(err_of(header(3, u64::MAX / 2, 0)).contains("tensor_count"));

    let mut h = header(3, 0, 1);
    h.extend_from_slice(&u64::MAX.to_le_bytes());
    h.extend_from_slice(&[0; 16]);
    assert!(err_of(h).contains("string length"));

    let mut h = header(3, 0, 1);
    kv(&mut h, "k", 99, &[]);
    assert!(err_of(h).contains("unknown value type 99"));

    let mut h = header(3, 0, 1);
    let mut arr = 4u32.to_le_bytes().to_vec();
    arr.extend_from_slice(&(1u64 << 60).to_le_bytes());
    kv(&mut h, "tokenizer.ggml.scores", 9, &arr);
    let e = err_of(h);
    assert!(e.contains("tokenizer.ggml.scores") && e.contains("cannot fit"), "{e}");

    let mut h = header(3, 0, 1);
    let mut nested = Vec::new();
    for _ in 0..20 {
        nested.extend_from_slice(&9u32.to_le_bytes());
        nested.extend_from_slice(&1u64.to_le_bytes());
    }
    nested.extend_from_slice(&[0; 64]);
    kv(&mut h, "deep", 9, &nested);
    assert!(err_of(h).contains("nested deeper"));

    let mut h = header(3, 0, 1);
    kv(&mut h, "b", 7, &[2]);
    assert!(err_of(h).contains("bool byte 2"));

    let mut h = header(3, 0, 1);
    let mut s = Vec::new();
    string(&mut s, &[0xff, 0xfe]);
    kv(&mut h, "s", 8, &s);
    assert!(err_of(h).contains("not UTF-8"));

    let mut h = header(3, 0, 2);
    kv(&mut h, "dup", 4, &1u32.to_le_bytes());
    kv(&mut h, "dup", 4, &1u32.to_le_bytes());
    assert!(err_of(h).contains("duplicate"));

    let mut h = header(3, 0, 1);
    kv(&mut h, "general.alignment", 4, &3u32.to_le_bytes());
    assert!(err_of(h).contains("general.alignment"));
}

#[test]
fn hostile_tensor_infos_get_named_errors() {
    // A valid one first, so each error below is the one named field.
    assert!(GgufFile::from_bytes(tensor_file(2, &[32, 2], 8, 0, 68)).is_ok());
    assert!(err_of(tensor_file(0, &[], 8, 0, 68)).contains("0 dimensions"));
    assert!(err_of(tensor_file(5, &[1, 1, 1, 1, 1], 0, 0, 64)).contains("5 dimensions"));
    assert!(err_of(tensor_file(2, &[1 << 40, 1 << 40], 0, 0, 64)).contains("overflows"));
    assert!(err_of(tensor_file(2, &[32, 2], 4, 0, 68)).contains("unknown tensor type 4"));
    assert!(err_of(tensor_file(2, &[33, 2], 8, 0, 68)).contains("not a multiple"));
    assert!(err_of(tensor_file(2, &[32, 2], 8, 7, 68)).contains("alignment"));
    let e = err_of(tensor_file(2, &[32, 2], 8, 32, 68));
    assert!(e.contains("blk.0.w") && e.contains("past the end"), "{e}");
    let e = err_of(tensor_file(2, &[32, 2], 8, u64::MAX - 31, 68));
    assert!(e.contains("blk.0.w"), "{e}");

    // Two tensors sharing bytes.
    let mut w = GgufWriter::new();
    w.add_tensor("a", &[8], GgmlType::F32).unwrap();
    w.add_tensor("b", &[8], GgmlType::F32).unwrap();
    let mut bytes = w.write_all(Vec::new(), |_| &[0u8; 32]).unwrap();
    let f = GgufFile::from_bytes(bytes.clone()).unwrap();
    // Rewrite b's offset (the last 8 bytes of the header before padding) to 0.
    let b_offset_at = bytes.windows(9).position(|w| w == b"\x01\0\0\0\0\0\0\0b").unwrap() + 9 + 4 + 8 + 4;
    assert_eq!(&bytes[b_offset_at..b_offset_at + 8], &32u64.to_le_bytes());
    bytes[b_offset_at..b_offset_at + 8].copy_from_slice(&0u64.to_le_bytes());
    assert!(err_of(bytes).contains("overlaps"));
    drop(f);
}

#[test]
fn errors_opening_files_name_the_path() {
    let dir = std::env::temp_dir().join(format!("tandem-gguf-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("bad.gguf");
    std::fs::write(&p, b"GGUF\x03\0\0\0").unwrap();
    let e = GgufFile::open(&p).unwrap_err();
    assert!(matches!(e, GgufError::InFile { .. }));
    assert!(
        e.to_string().contains("bad.gguf") && e.to_string().contains("tensor_count"),
        "{e}"
    );
    let e = GgufFile::open(dir.join("missing.gguf")).unwrap_err();
    assert!(e.to_string().contains("missing.gguf"));
    std::fs::remove_dir_all(&dir).ok();
}

/// The fuzzer's oom-0e1e3bff: a tensor-less header declaring `general.alignment` 2^31 (a valid power
/// of two) parses, and re-writing it must not pad the header to 2 GiB: with no data section there is
/// nothing to align. With tensors the padding stays (a file that parses has its data past it).
#[test]
fn a_huge_alignment_without_tensors_rewrites_without_padding() {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", "llama").unwrap();
    w.add_metadata("general.alignment", Value::U32(1 << 31)).unwrap();
    let bytes = w.write_all(Vec::new(), |_| &[]).unwrap();
    assert!(bytes.len() < 1024, "{} bytes", bytes.len());
    let f = GgufFile::from_bytes(bytes.clone()).unwrap();
    assert_eq!(f.alignment, 1 << 31);
    let again = GgufWriter::from_file(&f)
        .unwrap()
        .write_all(Vec::new(), |_| &[])
        .unwrap();
    assert_eq!(again, bytes);
    // With a tensor, the header is still padded to the alignment (32 here).
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", "llama").unwrap();
    w.add_tensor("v", &[3], GgmlType::F32).unwrap();
    let bytes = w
        .write_all(Vec::new(), |t| Box::leak(vec![0u8; t.size as usize].into_boxed_slice()))
        .unwrap();
    let f = GgufFile::from_bytes(bytes).unwrap();
    assert_eq!(f.data_offset % 32, 0);
}
