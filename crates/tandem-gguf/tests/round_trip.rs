//! Writer → reader round trips over every value type, nested arrays, alignment and tensor layout.

use tandem_gguf::{Array, GgmlType, GgufFile, GgufWriter, Value};

fn sample_writer() -> (GgufWriter, Vec<Vec<u8>>) {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", "llama").unwrap();
    w.add_metadata("general.alignment", Value::U32(64)).unwrap();
    w.add_metadata("t.u8", Value::U8(200)).unwrap();
    w.add_metadata("t.i8", Value::I8(-5)).unwrap();
    w.add_metadata("t.u16", Value::U16(65000)).unwrap();
    w.add_metadata("t.i16", Value::I16(-30000)).unwrap();
    w.add_metadata("t.u32", Value::U32(4_000_000_000)).unwrap();
    w.add_metadata("t.i32", Value::I32(-2_000_000_000)).unwrap();
    w.add_metadata("t.f32", Value::F32(1.5e-6)).unwrap();
    w.add_metadata("t.bool", Value::Bool(true)).unwrap();
    w.add_metadata("t.string", "héllo ✓").unwrap();
    w.add_metadata("t.u64", Value::U64(u64::MAX)).unwrap();
    w.add_metadata("t.i64", Value::I64(i64::MIN)).unwrap();
    w.add_metadata("t.f64", Value::F64(-2.5e300)).unwrap();
    w.add_metadata("t.empty", Array::String(vec![])).unwrap();
    w.add_metadata("t.strings", Array::String(vec!["a".into(), "".into(), "▁b".into()]))
        .unwrap();
    w.add_metadata("t.floats", Array::F32(vec![0.5, -1.0])).unwrap();
    w.add_metadata("t.bools", Array::Bool(vec![true, false])).unwrap();
    w.add_metadata(
        "t.nested",
        Array::Array(vec![
            Array::I32(vec![1, 2, 3]),
            Array::String(vec!["x".into()]),
            Array::Array(vec![]),
        ]),
    )
    .unwrap();
    let shapes: [(&str, Vec<u64>, GgmlType); 3] = [
        ("a.weight", vec![64, 3], GgmlType::Q8_0),
        ("b.weight", vec![5], GgmlType::F32),
        ("c.weight", vec![256, 2, 2], GgmlType::Q4_K),
    ];
    let mut data = Vec::new();
    for (i, (name, dims, ty)) in shapes.iter().enumerate() {
        let info = w.add_tensor(name, dims, *ty).unwrap();
        data.push(
            (0..info.size)
                .map(|b| (b as u8).wrapping_mul(31).wrapping_add(i as u8))
                .collect(),
        );
    }
    (w, data)
}

fn write(w: &GgufWriter, data: &[Vec<u8>]) -> Vec<u8> {
    let mut i = 0;
    w.write_all(Vec::new(), |_| {
        i += 1;
        &data[i - 1]
    })
    .unwrap()
}

#[test]
fn everything_written_reads_back() {
    let (w, data) = sample_writer();
    let bytes = write(&w, &data);
    assert_eq!(bytes.len() as u64, w.file_size());
    let f = GgufFile::from_bytes(bytes.clone()).unwrap();
    assert_eq!(f.version, 3);
    assert_eq!(f.alignment, 64);
    assert_eq!(f.data_offset % 64, 0);
    assert_eq!(f.get("t.u8"), Some(&Value::U8(200)));
    assert_eq!(f.get("t.i64"), Some(&Value::I64(i64::MIN)));
    assert_eq!(f.get_str("t.string").unwrap(), Some("héllo ✓"));
    assert_eq!(f.get_u64("t.u32").unwrap(), Some(4_000_000_000));
    assert!(f.get_u64("t.i8").is_err(), "negative is no u64");
    assert!(f.get_str("t.u8").is_err(), "type mismatch is an error");
    assert_eq!(f.get_u64("absent").unwrap(), None);
    match f.get("t.nested") {
        Some(Value::Array(Array::Array(inner))) => {
            assert_eq!(inner[0], Array::I32(vec![1, 2, 3]));
            assert_eq!(inner[2], Array::Array(vec![]));
        }
        other => panic!("nested array read as {other:?}"),
    }
    for (t, d) in f.tensors().iter().zip(&data) {
        assert_eq!(f.tensor_data(t), &d[..], "{}", t.name);
        assert_eq!(t.offset % 64, 0);
    }
    assert_eq!(f.tensor_info("c.weight").unwrap().dims, vec![256, 2, 2]);

    // Reading back and writing again gives the same bytes.
    let again = GgufWriter::from_file(&f).unwrap();
    let bytes2 = again.write_all(Vec::new(), |t| f.tensor_data(t)).unwrap();
    assert_eq!(bytes, bytes2);
}

#[test]
fn writer_refuses_bad_declarations() {
    let mut w = GgufWriter::new();
    w.add_metadata("k", Value::U32(1)).unwrap();
    assert!(w.add_metadata("k", Value::U32(2)).is_err());
    assert!(w.add_tensor("t", &[33], GgmlType::Q4_0).is_err(), "not whole blocks");
    assert!(w.add_tensor("t", &[], GgmlType::F32).is_err());
    assert!(w.add_tensor("t", &[1, 1, 1, 1, 1], GgmlType::F32).is_err());
    w.add_tensor("t", &[4], GgmlType::F32).unwrap();
    assert!(w.add_tensor("t", &[4], GgmlType::F32).is_err(), "duplicate");
    let mut sink = w.write_header(Vec::new()).unwrap();
    sink.write(&[0; 8]).unwrap();
    assert!(sink.finish().is_err(), "short tensor data");
}
