//! Chat templates: the GGUF's `tokenizer.chat_template` (Jinja, rendered with minijinja the way Hugging
//! Face's `apply_chat_template` does: `trim_blocks`, `lstrip_blocks`, Python string methods,
//! `raise_exception`, `bos_token`/`eos_token`), or a built-in format for the architecture when the file has
//! none (Gemma's turns for the Gemma family, ChatML otherwise), written out as llama.cpp's built-ins do.

use minijinja::{context, Environment, Error, ErrorKind};
use serde::{Deserialize, Serialize};
use tandem_gguf::{Array, GgufFile, Value};

use crate::vocab::{get_str, KEY_BOS, KEY_EOS, KEY_TOKENS};
use crate::TokenizerError;

pub const KEY_CHAT_TEMPLATE: &str = "tokenizer.chat_template";

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }

    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }

    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }

    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }
}

/// Which built-in format a template-less model gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BuiltinTemplate {
    /// `<start_of_turn>user\n…<end_of_turn>\n`, "assistant" shown as "model", system text merged into the
    /// next user turn.
    Gemma,
    /// `<|im_start|>role\n…<|im_end|>\n`.
    ChatMl,
}

impl BuiltinTemplate {
    /// The built-in format for a `general.architecture`.
    pub fn for_architecture(arch: &str) -> Self {
        match arch {
            "gemma" | "gemma2" | "gemma3" | "gemma3n" => BuiltinTemplate::Gemma,
            _ => BuiltinTemplate::ChatMl,
        }
    }
}

enum Kind {
    Jinja {
        env: Box<Environment<'static>>,
        source: String,
    },
    Builtin(BuiltinTemplate),
}

pub struct ChatTemplate {
    kind: Kind,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.kind {
            Kind::Jinja { .. } => "jinja".to_string(),
            Kind::Builtin(b) => format!("{b:?}"),
        };
        f.debug_struct("ChatTemplate")
            .field("kind", &kind)
            .field("bos_token", &self.bos_token)
            .finish()
    }
}

fn template_err(e: Error) -> TokenizerError {
    TokenizerError::Template(format!("{e:#}"))
}

/// The text of the token a special-id key names, or "" when the key or the vocabulary is missing.
fn token_text(file: &GgufFile, key: &str) -> String {
    let id = file.get(key).and_then(Value::as_u64);
    match (id, file.get(KEY_TOKENS)) {
        (Some(id), Some(Value::Array(Array::String(tokens)))) => tokens.get(id as usize).cloned().unwrap_or_default(),
        _ => String::new(),
    }
}

/// C++ `isspace`-style trimming, as llama.cpp's built-in templates trim message contents.
fn trim(s: &str) -> &str {
    s.trim_matches(|c: char| matches!(c, ' ' | '\t' | '\n' | '\x0B' | '\x0C' | '\r'))
}

impl ChatTemplate {
    /// The GGUF's template, or the built-in one for its architecture when it has none.
    pub fn from_gguf(file: &GgufFile) -> Result<Self, TokenizerError> {
        let bos = token_text(file, KEY_BOS);
        let eos = token_text(file, KEY_EOS);
        match get_str(file, KEY_CHAT_TEMPLATE)? {
            Some(source) => Self::from_source(source, &bos, &eos).map_err(|e| match e {
                TokenizerError::Template(reason) => TokenizerError::Metadata {
                    key: KEY_CHAT_TEMPLATE.into(),
                    reason,
                },
                other => other,
            }),
            None => {
                let arch = get_str(file, "general.architecture")?.unwrap_or("");
                Ok(Self::builtin(BuiltinTemplate::for_architecture(arch), &bos, &eos))
            }
        }
    }

    /// Compiles a Jinja chat template.
    pub fn from_source(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, TokenizerError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> Result<String, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_template_owned("chat_template", source.to_string())
            .map_err(template_err)?;
        Ok(ChatTemplate {
            kind: Kind::Jinja {
                env: Box::new(env),
                source: source.to_string(),
            },
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        })
    }

    pub fn builtin(which: BuiltinTemplate, bos_token: &str, eos_token: &str) -> Self {
        ChatTemplate {
            kind: Kind::Builtin(which),
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        }
    }

    /// The Jinja source, when the template came from one.
    pub fn source(&self) -> Option<&str> {
        match &self.kind {
            Kind::Jinja { source, .. } => Some(source),
            Kind::Builtin(_) => None,
        }
    }

    pub fn builtin_kind(&self) -> Option<BuiltinTemplate> {
        match &self.kind {
            Kind::Jinja { .. } => None,
            Kind::Builtin(b) => Some(*b),
        }
    }

    /// Renders a conversation; with `add_generation_prompt`, ends with the opening of the assistant's turn.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String, TokenizerError> {
        match &self.kind {
            Kind::Jinja { env, .. } => {
                let tmpl = env.get_template("chat_template").map_err(template_err)?;
                tmpl.render(context! {
                    messages => messages,
                    add_generation_prompt => add_generation_prompt,
                    bos_token => self.bos_token.as_str(),
                    eos_token => self.eos_token.as_str(),
                })
                .map_err(template_err)
            }
            Kind::Builtin(BuiltinTemplate::Gemma) => Ok(render_gemma(messages, add_generation_prompt)),
            Kind::Builtin(BuiltinTemplate::ChatMl) => Ok(render_chatml(messages, add_generation_prompt)),
        }
    }
}

fn render_gemma(messages: &[ChatMessage], add_generation_prompt: bool) -> String {
    let mut out = String::new();
    let mut system = String::new();
    for m in messages {
        if m.role == "system" {
            system.push_str(trim(&m.content));
            continue;
        }
        let role = if m.role == "assistant" {
            "model"
        } else {
            m.role.as_str()
        };
        out.push_str("<start_of_turn>");
        out.push_str(role);
        out.push('\n');
        if !system.is_empty() && role != "model" {
            out.push_str(&system);
            out.push_str("\n\n");
            system.clear();
        }
        out.push_str(trim(&m.content));
        out.push_str("<end_of_turn>\n");
    }
    if add_generation_prompt {
        out.push_str("<start_of_turn>model\n");
    }
    out
}

fn render_chatml(messages: &[ChatMessage], add_generation_prompt: bool) -> String {
    let mut out = String::new();
    for m in messages {
        out.push_str("<|im_start|>");
        out.push_str(&m.role);
        out.push('\n');
        out.push_str(&m.content);
        out.push_str("<|im_end|>\n");
    }
    if add_generation_prompt {
        out.push_str("<|im_start|>assistant\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemma_builtin() {
        let t = ChatTemplate::builtin(BuiltinTemplate::Gemma, "<bos>", "<eos>");
        let msgs = [
            ChatMessage::system("Be brief."),
            ChatMessage::user("Hi!"),
            ChatMessage::assistant("Hello."),
            ChatMessage::user(" Bye \n"),
        ];
        assert_eq!(
            t.render(&msgs, true).unwrap(),
            "<start_of_turn>user\nBe brief.\n\nHi!<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n\
             <start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
        );
        assert_eq!(
            t.render(&msgs[1..2], false).unwrap(),
            "<start_of_turn>user\nHi!<end_of_turn>\n"
        );
    }

    #[test]
    fn chatml_builtin() {
        let t = ChatTemplate::builtin(BuiltinTemplate::ChatMl, "", "");
        let msgs = [ChatMessage::system("S"), ChatMessage::user("U")];
        assert_eq!(
            t.render(&msgs, true).unwrap(),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn jinja_features() {
        let src =
            "{{ bos_token }}{% for m in messages %}\n{{ m.role.upper() }}: {{ m['content'].strip() }}\n{% endfor %}\
                   {% if add_generation_prompt %}A:{% endif %}";
        let t = ChatTemplate::from_source(src, "<s>", "</s>").unwrap();
        assert_eq!(
            t.render(&[ChatMessage::user("  hi ")], true).unwrap(),
            "<s>USER: hi\nA:"
        );
        let bad = ChatTemplate::from_source("{{ raise_exception('no system role') }}", "", "").unwrap();
        let err = bad.render(&[], false).unwrap_err().to_string();
        assert!(err.contains("no system role"), "{err}");
        assert!(ChatTemplate::from_source("{% for %}", "", "").is_err());
    }
}
