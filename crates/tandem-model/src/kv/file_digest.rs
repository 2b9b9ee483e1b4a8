//! The model file's part of the KV fingerprint (`wire::fingerprint`): a SHA-256 tree hash of the GGUF
//! file, computed by several threads, and remembered per file so that a restart does not read the whole
//! file again (`docs/KV-WIRE.md`, "Identity", has the exact definition).
//!
//! A flat SHA-256 is one thread over the whole file: tens of seconds for a 17 GB model at every start.
//! The tree hash covers every byte as strongly (SHA-256 over the SHA-256s of fixed-size blocks, with the
//! file size and block size in front), and its blocks hash in parallel. The memo is keyed by what
//! changes when the file does (its canonical path, size, modification and change times, device and
//! inode); a file replaced or written in place gets a new key and is hashed again.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use sha2::{Digest, Sha256};

/// Bytes per leaf of the tree hash. Part of the definition: changing it changes every fingerprint.
pub const TREE_BLOCK: usize = 16 << 20;

/// Names the tree hash's definition (hashed first); a new definition takes a new tag.
const TREE_TAG: &[u8] = b"tandem gguf tree sha256 v1\n";

/// SHA-256 over `TREE_TAG`, the length (u64 LE), the block size (u64 LE) and the SHA-256 of each
/// `block`-byte piece of `bytes` in order (the last one shorter; none for an empty file). `threads`
/// hash pieces at once; the result does not depend on how many.
pub fn tree_hash(bytes: &[u8], block: usize, threads: usize) -> [u8; 32] {
    let block = block.max(1);
    let n = bytes.len().div_ceil(block);
    let leaves = Mutex::new(vec![[0u8; 32]; n]);
    let next = AtomicUsize::new(0);
    let work = || loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        if i >= n {
            break;
        }
        let piece = &bytes[i * block..((i + 1) * block).min(bytes.len())];
        let leaf: [u8; 32] = Sha256::digest(piece).into();
        leaves.lock().unwrap_or_else(|e| e.into_inner())[i] = leaf;
    };
    std::thread::scope(|s| {
        for _ in 1..threads.clamp(1, n.max(1)) {
            s.spawn(work);
        }
        work();
    });
    let mut h = Sha256::new();
    h.update(TREE_TAG);
    h.update((bytes.len() as u64).to_le_bytes());
    h.update((block as u64).to_le_bytes());
    for leaf in leaves.into_inner().unwrap_or_else(|e| e.into_inner()) {
        h.update(leaf);
    }
    h.finalize().into()
}

/// What identifies one version of the file at `path`: `None` when it cannot be read.
fn memo_key(path: &Path) -> Option<String> {
    let canonical = std::fs::canonicalize(path).ok()?;
    let meta = std::fs::metadata(&canonical).ok()?;
    let mtime = meta
        .modified()
        .ok()?
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_nanos();
    #[cfg(unix)]
    let node = {
        use std::os::unix::fs::MetadataExt;
        format!(
            "dev {} ino {} ctime {}.{:09}",
            meta.dev(),
            meta.ino(),
            meta.ctime(),
            meta.ctime_nsec()
        )
    };
    #[cfg(not(unix))]
    let node = String::new();
    Some(format!(
        "{} size {} mtime {mtime} {node} block {TREE_BLOCK}",
        canonical.display(),
        meta.len()
    ))
}

/// The memo file for `key` under `dir`.
fn memo_path(dir: &Path, key: &str) -> PathBuf {
    let name: [u8; 32] = Sha256::digest(key.as_bytes()).into();
    dir.join(format!("{}.tree", super::wire::hex(&name[..16])))
}

/// `tree_hash` of `bytes`, the contents of the file at `path`, remembered under `memo_dir` (when given)
/// for as long as the file keeps its key. A memo that cannot be read or written only costs the hashing.
pub fn file_digest(bytes: &[u8], path: Option<&Path>, memo_dir: Option<&Path>) -> [u8; 32] {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let memo = path
        .zip(memo_dir)
        .and_then(|(path, dir)| memo_key(path).map(|key| (memo_path(dir, &key), key)));
    if let Some((file, key)) = &memo {
        if let Some(digest) = read_memo(file, key) {
            return digest;
        }
    }
    let digest = tree_hash(bytes, TREE_BLOCK, threads);
    if let Some((file, key)) = &memo {
        write_memo(file, key, &digest);
    }
    digest
}

/// The memo's digest, if it is for `key` (its first line) and well formed.
fn read_memo(file: &Path, key: &str) -> Option<[u8; 32]> {
    let text = std::fs::read_to_string(file).ok()?;
    let (stored, hex) = text.trim_end().split_once('\n')?;
    if stored != key || hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Writes the memo through a temporary file, so a reader never sees half of it.
fn write_memo(file: &Path, key: &str, digest: &[u8; 32]) {
    let Some(dir) = file.parent() else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let tmp = file.with_extension(format!("tmp{}", std::process::id()));
    let text = format!("{key}\n{}\n", super::wire::hex(digest));
    if std::fs::write(&tmp, text).is_ok() && std::fs::rename(&tmp, file).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sha(parts: &[&[u8]]) -> [u8; 32] {
        let mut h = Sha256::new();
        for p in parts {
            h.update(p);
        }
        h.finalize().into()
    }

    #[test]
    fn the_tree_hash_is_sha256_over_the_block_hashes() {
        let bytes = b"0123456789";
        // Blocks of 4: "0123", "4567", "89".
        let leaves = [sha(&[b"0123"]), sha(&[b"4567"]), sha(&[b"89"])];
        let want = sha(&[
            b"tandem gguf tree sha256 v1\n",
            &10u64.to_le_bytes(),
            &4u64.to_le_bytes(),
            &leaves[0],
            &leaves[1],
            &leaves[2],
        ]);
        for threads in [1, 2, 3, 8] {
            assert_eq!(tree_hash(bytes, 4, threads), want, "{threads} threads");
        }
        // The size and the block size are part of it: no two ways to cut the same bytes agree.
        assert_ne!(tree_hash(bytes, 5, 2), want);
        assert_ne!(tree_hash(&bytes[..9], 4, 2), want);
        let empty = sha(&[
            b"tandem gguf tree sha256 v1\n",
            &0u64.to_le_bytes(),
            &4u64.to_le_bytes(),
        ]);
        assert_eq!(tree_hash(b"", 4, 4), empty);
    }

    #[test]
    fn the_memo_serves_the_same_file_and_not_a_changed_one() {
        let dir = std::env::temp_dir().join(format!("tandem-digest-{}", std::process::id()));
        let memo = dir.join("memo");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("model.gguf");
        std::fs::write(&path, b"first weights").unwrap();
        let first = file_digest(b"first weights", Some(&path), Some(&memo));
        assert_eq!(first, tree_hash(b"first weights", TREE_BLOCK, 1));
        // The memo is what answers for an unchanged file: a forged entry is believed...
        let key = memo_key(&path).unwrap();
        write_memo(&memo_path(&memo, &key), &key, &[7; 32]);
        assert_eq!(file_digest(b"first weights", Some(&path), Some(&memo)), [7; 32]);
        // ...and a file written again (same size, new times) is hashed again.
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&path, b"other weights").unwrap();
        let other = file_digest(b"other weights", Some(&path), Some(&memo));
        assert_eq!(other, tree_hash(b"other weights", TREE_BLOCK, 1));
        // A file replaced by another (a new inode) too.
        let moved = dir.join("new.gguf");
        std::fs::write(&moved, b"third weights").unwrap();
        std::fs::rename(&moved, &path).unwrap();
        assert_eq!(
            file_digest(b"third weights", Some(&path), Some(&memo)),
            tree_hash(b"third weights", TREE_BLOCK, 1)
        );
        // No memo directory, or an unreadable one: the hash itself.
        assert_eq!(file_digest(b"x", None, Some(&memo)), tree_hash(b"x", TREE_BLOCK, 1));
        assert_eq!(
            file_digest(b"third weights", Some(&path), Some(&path.join("not a dir"))),
            tree_hash(b"third weights", TREE_BLOCK, 1)
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
