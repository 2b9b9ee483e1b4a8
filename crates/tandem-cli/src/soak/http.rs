//! A small HTTP/1.1 client over `std::net`, enough for the soak: it must see exactly what the server sent
//! (status, chunked SSE bodies, connections closed early) and misbehave on purpose (stall, disconnect),
//! which a full client library hides or forbids. Every socket has read and write timeouts, and every body
//! is read against a deadline and a size cap, so no call can hang or grow without bound.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// Longest status or header line accepted.
const MAX_LINE: usize = 16 << 10;
/// Most header lines accepted.
const MAX_HEADERS: usize = 100;
/// Largest response body read.
const MAX_BODY: usize = 8 << 20;

/// Where requests go, and the key they carry.
#[derive(Clone)]
pub struct Target {
    pub addr: SocketAddr,
    pub host: String,
    pub key: Option<String>,
    /// The longest any one read or write may wait.
    pub io_timeout: Duration,
}

impl Target {
    pub fn new(addr: &str, key: Option<String>, io_timeout: Duration) -> Result<Self> {
        let resolved = addr
            .to_socket_addrs()
            .with_context(|| format!("resolving {addr}"))?
            .next()
            .with_context(|| format!("{addr} resolves to no address"))?;
        if !resolved.ip().is_loopback() {
            bail!("the soak only drives a server on loopback; {addr} is {}", resolved.ip());
        }
        Ok(Target {
            addr: resolved,
            host: addr.to_string(),
            key,
            io_timeout,
        })
    }

    pub fn connect(&self) -> Result<TcpStream> {
        let s = TcpStream::connect_timeout(&self.addr, Duration::from_secs(5))
            .with_context(|| format!("connecting to {}", self.addr))?;
        s.set_read_timeout(Some(self.io_timeout))?;
        s.set_write_timeout(Some(self.io_timeout))?;
        s.set_nodelay(true)?;
        Ok(s)
    }

    /// The request's head (with `Content-Length` for `body_len`) and `Connection: close`.
    pub fn head(&self, method: &str, path: &str, body_len: usize) -> String {
        let auth = self
            .key
            .as_ref()
            .map(|k| format!("Authorization: Bearer {k}\r\n"))
            .unwrap_or_default();
        format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\n{auth}Content-Type: application/json\r\n\
             Content-Length: {body_len}\r\nConnection: close\r\n\r\n",
            self.host
        )
    }

    /// Sends a request; returns the response's head and a reader of its (de-chunked) body.
    pub fn send(&self, method: &str, path: &str, body: &[u8]) -> Result<(Head, Body)> {
        let mut s = self.connect()?;
        let mut bytes = self.head(method, path, body.len()).into_bytes();
        bytes.extend_from_slice(body);
        s.write_all(&bytes).context("sending the request")?;
        let mut reader = BufReader::new(s);
        let head = read_head(&mut reader)?;
        let body = Body::new(reader, &head);
        Ok((head, body))
    }

    /// A whole exchange: the head and the body, read before `deadline`.
    pub fn exchange(&self, method: &str, path: &str, body: &[u8], deadline: Instant) -> Result<(Head, Vec<u8>)> {
        let (head, mut reader) = self.send(method, path, body)?;
        let body = reader.read_all(deadline)?;
        Ok((head, body))
    }
}

/// A response's status and headers (names lower-cased).
pub struct Head {
    pub status: u16,
    pub headers: Vec<(String, String)>,
}

impl Head {
    pub fn get(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// Reads one CRLF-terminated line (without it), at most `MAX_LINE` bytes.
fn read_line(r: &mut impl BufRead) -> Result<String> {
    let mut buf = Vec::new();
    let n = r.by_ref().take(MAX_LINE as u64 + 1).read_until(b'\n', &mut buf)?;
    if n == 0 {
        bail!("the connection closed");
    }
    if buf.last() != Some(&b'\n') {
        bail!("a line longer than {MAX_LINE} bytes or cut short");
    }
    while matches!(buf.last(), Some(b'\n' | b'\r')) {
        buf.pop();
    }
    String::from_utf8(buf).context("a line that is not UTF-8")
}

pub fn read_head(r: &mut impl BufRead) -> Result<Head> {
    let line = read_line(r).context("reading the status line")?;
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("a malformed status line {line:?}"))?;
    let mut headers = Vec::new();
    loop {
        let line = read_line(r).context("reading the headers")?;
        if line.is_empty() {
            break;
        }
        if headers.len() >= MAX_HEADERS {
            bail!("more than {MAX_HEADERS} headers");
        }
        if let Some((name, value)) = line.split_once(':') {
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
        }
    }
    Ok(Head { status, headers })
}

enum Framing {
    Length(usize),
    /// Bytes left in the current chunk; `None` before a chunk's size line.
    Chunked(Option<usize>),
    Eof,
    Done,
}

/// A response body, de-chunked as it is read.
pub struct Body<R = BufReader<TcpStream>> {
    inner: R,
    framing: Framing,
}

impl<R: BufRead> Body<R> {
    fn new(inner: R, head: &Head) -> Self {
        let chunked = head
            .get("transfer-encoding")
            .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
        let framing = match (chunked, head.get("content-length").and_then(|v| v.parse().ok())) {
            (true, _) => Framing::Chunked(None),
            (false, Some(n)) => Framing::Length(n),
            (false, None) => Framing::Eof,
        };
        Body { inner, framing }
    }

    /// Whether the body ended where its framing says it ends (not by the connection closing early).
    pub fn complete(&self) -> bool {
        matches!(self.framing, Framing::Done | Framing::Eof)
    }

    /// The rest of the body, at most `MAX_BODY` bytes, read before `deadline`.
    pub fn read_all(&mut self, deadline: Instant) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            if Instant::now() > deadline {
                bail!("the response took longer than the request's time limit");
            }
            let n = self.read(&mut buf).context("reading the response body")?;
            if n == 0 {
                break;
            }
            if out.len() + n > MAX_BODY {
                bail!("a response body over {MAX_BODY} bytes");
            }
            out.extend_from_slice(&buf[..n]);
        }
        if !self.complete() {
            bail!("the connection closed before the body's end");
        }
        Ok(out)
    }

    /// The next line of the body (SSE), without its line end; `None` at the body's end.
    pub fn next_line(&mut self) -> Result<Option<String>> {
        let mut buf = Vec::new();
        let mut byte = [0u8; 1];
        loop {
            if self.read(&mut byte)? == 0 {
                if buf.is_empty() {
                    return Ok(None);
                }
                break;
            }
            if byte[0] == b'\n' {
                break;
            }
            if buf.len() >= MAX_BODY {
                bail!("an SSE line over {MAX_BODY} bytes");
            }
            buf.push(byte[0]);
        }
        if buf.last() == Some(&b'\r') {
            buf.pop();
        }
        String::from_utf8(buf)
            .map(Some)
            .context("an SSE line that is not UTF-8")
    }
}

impl<R: BufRead> Read for Body<R> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        let invalid = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_string());
        loop {
            match self.framing {
                Framing::Done => return Ok(0),
                Framing::Eof => return self.inner.read(out),
                Framing::Length(0) => {
                    self.framing = Framing::Done;
                    return Ok(0);
                }
                Framing::Length(left) => {
                    let k = out.len().min(left);
                    let n = self.inner.read(&mut out[..k])?;
                    if n == 0 {
                        return Ok(0);
                    }
                    self.framing = Framing::Length(left - n);
                    return Ok(n);
                }
                Framing::Chunked(None) => {
                    let line = read_line(&mut self.inner).map_err(|e| invalid(&format!("{e:#}")))?;
                    let size = line.split(';').next().unwrap_or("").trim();
                    let size = usize::from_str_radix(size, 16).map_err(|_| invalid("a malformed chunk size"))?;
                    if size == 0 {
                        // Trailers, then the blank line that ends the body.
                        while !read_line(&mut self.inner)
                            .map_err(|e| invalid(&format!("{e:#}")))?
                            .is_empty()
                        {}
                        self.framing = Framing::Done;
                        return Ok(0);
                    }
                    self.framing = Framing::Chunked(Some(size));
                }
                Framing::Chunked(Some(0)) => {
                    let line = read_line(&mut self.inner).map_err(|e| invalid(&format!("{e:#}")))?;
                    if !line.is_empty() {
                        return Err(invalid("a chunk longer than its size"));
                    }
                    self.framing = Framing::Chunked(None);
                }
                Framing::Chunked(Some(left)) => {
                    let k = out.len().min(left);
                    let n = self.inner.read(&mut out[..k])?;
                    if n == 0 {
                        return Ok(0);
                    }
                    self.framing = Framing::Chunked(Some(left - n));
                    return Ok(n);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(raw: &[u8]) -> Body<&[u8]> {
        let mut r = raw;
        let head = read_head(&mut r).unwrap();
        Body::new(r, &head)
    }

    #[test]
    fn chunked_sse_is_read_line_by_line() {
        let raw = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n\
                    7\r\ndata: a\r\n9\r\n\ndata: [D\r\n6\r\nONE]\n\n\r\n0\r\n\r\n";
        let mut b = body(raw);
        let mut lines = Vec::new();
        while let Some(l) = b.next_line().unwrap() {
            lines.push(l);
        }
        assert_eq!(lines, ["data: a", "data: [DONE]", ""]);
        assert!(b.complete());
    }

    #[test]
    fn a_body_cut_short_is_not_complete() {
        let mut b = body(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc");
        let far = Instant::now() + Duration::from_secs(5);
        assert!(b.read_all(far).is_err());
        let mut b = body(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nab");
        assert!(b.read_all(far).is_err());
        let mut b = body(b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\n{}");
        assert_eq!(b.read_all(far).unwrap(), b"{}");
    }
}
