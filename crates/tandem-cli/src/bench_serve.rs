//! `tandem bench serve`: drives a running server with a mixed load — short chats streaming tokens while
//! long prompts arrive among them — and reports what users feel: time to first token and the gaps
//! between tokens (p50/p99), and generated tokens per second. With `--soak MINUTES` it runs the soak
//! instead (see [`crate::soak`]), with these flags setting its clients and prompts.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::json;

#[derive(Args)]
pub struct BenchServeArgs {
    /// The server, e.g. 127.0.0.1:8080.
    #[arg(long, default_value = "127.0.0.1:8080")]
    addr: String,
    /// Concurrent short-chat clients.
    #[arg(long, default_value_t = 4)]
    clients: usize,
    /// Tokens each short request generates.
    #[arg(long, default_value_t = 64)]
    short_tokens: usize,
    /// Words in each long prompt (about 1.3 tokens a word).
    #[arg(long, default_value_t = 1500)]
    long_words: usize,
    /// Seconds between long prompts.
    #[arg(long, default_value_t = 4.0)]
    long_every: f64,
    /// Seconds the load runs.
    #[arg(long, default_value_t = 30.0)]
    duration: f64,
    #[arg(long)]
    api_key: Option<String>,
    #[command(flatten)]
    soak: crate::soak::SoakArgs,
}

#[derive(Default)]
struct Samples {
    ttft_short: Vec<f64>,
    ttft_long: Vec<f64>,
    gaps: Vec<f64>,
    tokens: usize,
}

/// Streams one completion; returns (time to first token, gaps between tokens, token count).
fn stream_once(addr: &str, key: Option<&str>, prompt: &str, max_tokens: usize) -> Result<(f64, Vec<f64>, usize)> {
    let body = json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": true}).to_string();
    let mut s = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    let auth = key
        .map(|k| format!("Authorization: Bearer {k}\r\n"))
        .unwrap_or_default();
    let start = Instant::now();
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut reader = BufReader::new(s);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    if !line.contains(" 200 ") {
        bail!("server answered {}", line.trim());
    }
    let (mut first, mut last, mut gaps, mut n) = (None, start, Vec::new(), 0);
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            break;
        }
        let Some(data) = line.trim().strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        let now = Instant::now();
        match first {
            None => first = Some(now - start),
            Some(_) => gaps.push((now - last).as_secs_f64()),
        }
        last = now;
        n += 1;
    }
    Ok((first.map_or(f64::NAN, |d| d.as_secs_f64()), gaps, n))
}

fn percentile(xs: &mut [f64], p: f64) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    xs.sort_by(f64::total_cmp);
    xs[((xs.len() - 1) as f64 * p).round() as usize]
}

pub fn bench_serve(args: &BenchServeArgs) -> Result<()> {
    if let Some(minutes) = args.soak.soak {
        let load = crate::soak::Load {
            addr: &args.addr,
            api_key: args.api_key.clone(),
            clients: args.clients,
            short_tokens: args.short_tokens,
            long_words: args.long_words,
            long_every: args.long_every,
        };
        return crate::soak::run(&load, &args.soak, minutes);
    }
    let samples = Arc::new(Mutex::new(Samples::default()));
    let deadline = Instant::now() + Duration::from_secs_f64(args.duration);
    let long_prompt = "the quick brown fox jumps over the lazy dog ".repeat(args.long_words / 9 + 1);
    let start = Instant::now();
    std::thread::scope(|scope| -> Result<()> {
        let mut handles = Vec::new();
        for c in 0..args.clients {
            let samples = Arc::clone(&samples);
            handles.push(scope.spawn(move || -> Result<()> {
                let mut i = 0;
                while Instant::now() < deadline {
                    let prompt = format!("Client {c}, question {i}: tell me about the sea.");
                    let (ttft, gaps, n) = stream_once(&args.addr, args.api_key.as_deref(), &prompt, args.short_tokens)?;
                    let mut s = samples.lock().unwrap_or_else(|e| e.into_inner());
                    s.ttft_short.push(ttft);
                    s.gaps.extend(gaps);
                    s.tokens += n;
                    i += 1;
                }
                Ok(())
            }));
        }
        let samples = Arc::clone(&samples);
        let long_prompt = &long_prompt;
        handles.push(scope.spawn(move || -> Result<()> {
            while Instant::now() + Duration::from_secs_f64(args.long_every) < deadline {
                std::thread::sleep(Duration::from_secs_f64(args.long_every));
                let (ttft, _, n) = stream_once(&args.addr, args.api_key.as_deref(), long_prompt, 8)?;
                let mut s = samples.lock().unwrap_or_else(|e| e.into_inner());
                s.ttft_long.push(ttft);
                s.tokens += n;
            }
            Ok(())
        }));
        for h in handles {
            h.join().map_err(|_| anyhow::anyhow!("a client thread panicked"))??;
        }
        Ok(())
    })?;
    let elapsed = start.elapsed().as_secs_f64();
    let mut s = samples.lock().unwrap_or_else(|e| e.into_inner());
    let ms = |x: f64| x * 1e3;
    println!("| metric | p50 | p99 | n |");
    println!("|---|---:|---:|---:|");
    let n_short = s.ttft_short.len();
    let n_long = s.ttft_long.len();
    let n_gaps = s.gaps.len();
    let (a, b) = (percentile(&mut s.ttft_short, 0.5), percentile(&mut s.ttft_short, 0.99));
    println!("| TTFT, short chats (ms) | {:.1} | {:.1} | {n_short} |", ms(a), ms(b));
    let (a, b) = (percentile(&mut s.ttft_long, 0.5), percentile(&mut s.ttft_long, 0.99));
    println!("| TTFT, long prompts (ms) | {:.1} | {:.1} | {n_long} |", ms(a), ms(b));
    let (a, b) = (percentile(&mut s.gaps, 0.5), percentile(&mut s.gaps, 0.99));
    println!("| inter-token gap (ms) | {:.1} | {:.1} | {n_gaps} |", ms(a), ms(b));
    println!(
        "\ngenerated {} tokens in {elapsed:.1} s: {:.1} tokens/s",
        s.tokens,
        s.tokens as f64 / elapsed
    );
    Ok(())
}
