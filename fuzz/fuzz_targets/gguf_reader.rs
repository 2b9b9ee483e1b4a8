//! Any bytes: parsing returns Ok or an error, never panics; what parses can be walked and re-written.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tandem_gguf::{GgufFile, GgufWriter};

fuzz_target!(|data: &[u8]| {
    if let Ok(file) = GgufFile::from_bytes(data.to_vec()) {
        for (_, value) in file.metadata() {
            let _ = value.summary(4);
        }
        for t in file.tensors() {
            let _ = file.tensor_data(t).len();
        }
        if let Ok(w) = GgufWriter::from_file(&file) {
            let _ = w.write_all(Vec::new(), |t| file.tensor_data(t));
        }
    }
});
