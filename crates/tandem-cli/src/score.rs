//! `tandem score`: teacher-forced NLL, perplexity, top-k logits at chosen positions, and the sha256 of
//! every position's logits.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use serde_json::json;
use tandem_engine::score::ScoreOptions;

use crate::generate::{load, ModelArgs};
use tandem_runtime::on_engine;

#[derive(Args)]
pub struct ScoreArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The text to score (tokenized as generation would see it, BOS included when the model adds one).
    #[arg(long)]
    pub prompt_file: PathBuf,
    /// How many logits to list at each of --positions.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// Positions (comma-separated) whose top logits to list.
    #[arg(long, value_delimiter = ',')]
    pub positions: Vec<usize>,
    /// Print JSON (the only format; kept for the command line llama.cpp users expect).
    #[arg(long)]
    pub json: bool,
}

pub fn score(args: &ScoreArgs) -> Result<()> {
    let text = std::fs::read_to_string(&args.prompt_file)
        .with_context(|| format!("reading {}", args.prompt_file.display()))?;
    let mut loaded = load(&args.model)?;
    let ids = loaded.tokenizer.try_encode(&text, true, false)?;
    let n_ctx = loaded.n_ctx.max(ids.len());
    let opts = ScoreOptions {
        top_k: args.top,
        positions: args.positions.clone(),
        ..ScoreOptions::chunked(args.model.prefill_chunk)
    };
    let report = on_engine!(&mut loaded.engine, |e| {
        let mut kv = e.try_new_sequence(n_ctx)?;
        e.score(&mut kv, &ids, &opts)
    })?;
    let top: Vec<_> = report
        .top
        .iter()
        .map(|(pos, top)| json!({"pos": pos, "top": top.iter().map(|(id, l)| json!([id, l])).collect::<Vec<_>>()}))
        .collect();
    let out = json!({
        "n_tokens": report.n_tokens,
        "mean_nll": report.mean_nll,
        "perplexity": report.perplexity,
        "top": top,
        "logits_sha256": report.logits_sha256,
    });
    println!("{out}");
    Ok(())
}
