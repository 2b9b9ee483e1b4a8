//! `tandem tokenize` and `tandem detokenize`.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use tandem_tokenizer::Tokenizer;

#[derive(Args)]
pub struct TokenizeArgs {
    /// A GGUF path or a known model alias.
    #[arg(long, short = 'm', default_value = crate::registry::DEFAULT_MODEL)]
    model: String,
    /// Leave out the BOS token the model would add.
    #[arg(long)]
    no_bos: bool,
    /// Parse special tokens such as `<start_of_turn>` in the text.
    #[arg(long)]
    special: bool,
    /// Print a JSON array of ids.
    #[arg(long)]
    json: bool,
    /// Read the text from a file.
    #[arg(long, conflicts_with = "text")]
    file: Option<PathBuf>,
    /// The text to tokenize.
    #[arg(required_unless_present = "file")]
    text: Option<String>,
}

#[derive(Args)]
pub struct DetokenizeArgs {
    #[arg(long, short = 'm', default_value = crate::registry::DEFAULT_MODEL)]
    model: String,
    /// Render control tokens such as `<bos>` as text.
    #[arg(long)]
    special: bool,
    /// Token ids.
    #[arg(required = true, num_args = 1..)]
    ids: Vec<u32>,
}

pub fn load(model: &str) -> Result<Tokenizer> {
    let file = crate::open_model(model)?;
    Tokenizer::from_gguf(&file).with_context(|| format!("building the tokenizer of {model}"))
}

pub fn tokenize(args: &TokenizeArgs) -> Result<()> {
    let text = match (&args.file, &args.text) {
        (Some(path), _) => std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?,
        (None, Some(t)) => t.clone(),
        (None, None) => unreachable!("clap requires one of them"),
    };
    let tok = load(&args.model)?;
    let ids = tok.try_encode(&text, !args.no_bos, args.special)?;
    if args.json {
        println!("{}", serde_json::to_string(&ids)?);
    } else {
        for id in &ids {
            let piece = String::from_utf8_lossy(&tok.token_to_piece(*id, true)).into_owned();
            println!("{id:>7} {piece:?}");
        }
    }
    Ok(())
}

pub fn detokenize(args: &DetokenizeArgs) -> Result<()> {
    let tok = load(&args.model)?;
    if let Some(bad) = args.ids.iter().find(|&&id| id as usize >= tok.n_vocab()) {
        anyhow::bail!("token id {bad} is outside the vocabulary of {} tokens", tok.n_vocab());
    }
    println!("{}", tok.decode(&args.ids, args.special));
    Ok(())
}
