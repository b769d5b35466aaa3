//! The tokenizer and chat template a GGUF file carries in its metadata.
//!
//! The vocabulary, merges and token types become a `tokenizers` byte-level BPE (`gpt2`); the
//! pre-tokenizer is rebuilt from `tokenizer.ggml.pre`, which names a regex list hard-coded in
//! llama.cpp (llama-vocab.cpp), so only the names listed in [`SUPPORTED_PRE`] load: an unknown one
//! is an error rather than a guess that would tokenize differently from the model's training.
//! A SentencePiece vocabulary (`llama`) becomes a BPE whose merges follow its scores.
//! The chat template (`tokenizer.chat_template`, Jinja as in transformers) renders with minijinja.

use minijinja::{context, Environment, ErrorKind};
use tokenizers::decoders::byte_level::ByteLevel;
use tokenizers::decoders::{byte_fallback::ByteFallback, fuse::Fuse, sequence::Sequence as DecoderSequence};
use tokenizers::normalizers::{prepend::Prepend, replace::Replace, utils::Sequence as NormalizerSequence};
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::{digits::Digits, sequence::Sequence, split::Split, split::SplitPattern};
use tokenizers::SplitDelimiterBehavior;
use tokenizers::{AddedToken, DecodeStream, DecoderWrapper, ModelWrapper, NormalizerWrapper, PostProcessorWrapper, PreTokenizerWrapper};

use crate::error::{LabError, LabError::Invalid, Result};
use crate::weights::gguf::{Gguf, Value};

/// The `tokenizer.ggml.pre` values this module can reproduce.
pub const SUPPORTED_PRE: &[&str] = &["smollm", "llama-bpe", "llama3", "llama-v3"];

/// llama.cpp's `llama_token_type` values that matter here.
const NORMAL: u64 = 1;
const CONTROL: u64 = 3;
const USER_DEFINED: u64 = 4;

/// A byte-level BPE tokenizer read from GGUF metadata.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    tokens: Vec<String>,
    bos: u32,
    eos: u32,
    pad: Option<u32>,
    add_bos: bool,
    /// Ids that end a generation, sorted.
    eog: Vec<u32>,
    /// Bytes the vocabulary cannot spell: no byte-level symbol (SmolLM2 lacks 21, among them 0x04
    /// and 0xF5..=0xFF), or in a SentencePiece vocabulary no `<0xXX>` token. BPE with no unknown
    /// token would drop them silently; text holding one is refused instead, so whatever encodes
    /// decodes back to the same text.
    unencodable: [bool; 256],
    /// SentencePiece's leading space, added before the text, comes off the decoded text.
    strip_space: bool,
}

/// Text from ids that arrive one at a time; holds back tokens that end inside a UTF-8 character.
pub struct TextStream<'a> {
    vocab_size: usize,
    inner: DecodeStream<'a, ModelWrapper, NormalizerWrapper, PreTokenizerWrapper, PostProcessorWrapper, DecoderWrapper>,
}

/// A chat template with the model's BOS and EOS text, ready to render conversations.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
}

fn tk(doing: &str) -> impl Fn(tokenizers::Error) -> LabError + '_ {
    move |e| Invalid(format!("tokenizer: {doing}: {e}"))
}

fn get<'m>(meta: &'m [(String, Value)], key: &str) -> Option<&'m Value> {
    meta.iter().find(|(k, _)| k == key).map(|(_, v)| v)
}

fn required<'m>(meta: &'m [(String, Value)], key: &str) -> Result<&'m Value> {
    get(meta, key).ok_or_else(|| Invalid(format!("GGUF metadata has no `{key}`")))
}

fn string<'m>(meta: &'m [(String, Value)], key: &str) -> Result<&'m str> {
    required(meta, key)?.as_str().ok_or_else(|| Invalid(format!("GGUF metadata `{key}` is not a string")))
}

fn array<'m>(meta: &'m [(String, Value)], key: &str) -> Result<&'m [Value]> {
    required(meta, key)?.as_array().ok_or_else(|| Invalid(format!("GGUF metadata `{key}` is not an array")))
}

fn strings<'m>(meta: &'m [(String, Value)], key: &str) -> Result<Vec<&'m str>> {
    let items = array(meta, key)?.iter().enumerate();
    items.map(|(i, v)| v.as_str().ok_or_else(|| Invalid(format!("GGUF metadata `{key}`[{i}] is not a string")))).collect()
}

/// A token id that must name an entry of the vocabulary, or `None` when the key is absent.
fn token_id(meta: &[(String, Value)], key: &str, vocab_size: usize) -> Result<Option<u32>> {
    let Some(v) = get(meta, key) else { return Ok(None) };
    match v.as_u64() {
        Some(id) if (id as usize) < vocab_size => Ok(Some(id as u32)),
        _ => Err(Invalid(format!("GGUF metadata `{key}` is {v:?}, not a token id below the vocabulary size {vocab_size}"))),
    }
}

fn required_id(meta: &[(String, Value)], key: &str, vocab_size: usize) -> Result<u32> {
    token_id(meta, key, vocab_size)?.ok_or_else(|| Invalid(format!("GGUF metadata has no `{key}`")))
}

/// GPT-2's byte-level symbols: printable Latin-1 bytes stand for themselves, the other 68 bytes
/// take U+0100 onwards in byte order (`tokenizers` keeps its copy of this table private).
fn byte_symbols() -> [char; 256] {
    let mut next = 0x100;
    std::array::from_fn(|b| match b as u8 {
        b'!'..=b'~' | 0xa1..=0xac | 0xae..=0xff => b as u8 as char,
        _ => {
            next += 1;
            char::from_u32(next - 1).expect("below U+0144")
        }
    })
}

/// Llama 3's split (its tokenizer.json's regex with the case-insensitive contractions spelled
/// out, as llama.cpp writes it for `llama-bpe`): letters with one leading non-letter, digits in
/// runs of up to three, punctuation with its trailing newlines, whitespace.
const LLAMA3_SPLIT: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How llama.cpp splits text for `tokenizer.ggml.pre = pre` before the merges, and whether a
/// piece found whole in the vocabulary skips them (Llama 3's `ignore_merges`).
fn pre_tokenizer(pre: &str) -> Result<(Sequence, bool)> {
    // ByteLevel without its own regex only maps bytes to symbols; with it, it is GPT-2's split.
    let bytes = |gpt2_split: bool| -> PreTokenizerWrapper { ByteLevel::new(false, true, gpt2_split).into() };
    match pre {
        // llama.cpp's LLAMA_VOCAB_PRE_TYPE_SMOLLM splits every \p{N} off alone first, then runs
        // the GPT-2 regex on what is left. Digits tests `char::is_numeric`, which is \p{N}.
        "smollm" => Ok((Sequence::new(vec![Digits::new(true).into(), bytes(true)]), false)),
        "llama-bpe" | "llama3" | "llama-v3" => {
            let split = Split::new(SplitPattern::Regex(LLAMA3_SPLIT.into()), SplitDelimiterBehavior::Isolated, false).map_err(tk("the Llama 3 split"))?;
            Ok((Sequence::new(vec![split.into(), bytes(false)]), true))
        }
        _ => Err(Invalid(format!("tokenizer.ggml.pre `{pre}` is not supported (supported: {})", SUPPORTED_PRE.join(", ")))),
    }
}

/// llama.cpp's tokenizer for `tokenizer.ggml.model = llama` (SentencePiece BPE) as a `tokenizers`
/// BPE: spaces become `▁` (with one before each run of text when `space_prefix`), then adjacent
/// pieces merge while their concatenation is a token, the highest `tokenizer.ggml.scores` first;
/// characters without a token fall back to the `<0xXX>` byte tokens. The merge list that
/// reproduces this ranks every split of a token into two tokens by the token's score.
fn sentencepiece(meta: &[(String, Value)], tokens: &[String], types: &[u64], vocab: Vocab, space_prefix: bool) -> Result<(tokenizers::Tokenizer, [bool; 256])> {
    let scores = array(meta, "tokenizer.ggml.scores")?;
    if scores.len() != tokens.len() {
        return Err(Invalid(format!("tokenizer.ggml.scores has {} entries for {} tokens", scores.len(), tokens.len())));
    }
    let scores = scores.iter().enumerate().map(|(i, v)| match v {
        Value::F32(x) if x.is_finite() => Ok(*x),
        _ => Err(Invalid(format!("tokenizer.ggml.scores[{i}] is {v:?}, not a finite f32"))),
    });
    let scores = scores.collect::<Result<Vec<f32>>>()?;
    let mut ranked = Vec::new();
    for (id, t) in tokens.iter().enumerate().filter(|&(id, _)| types[id] == NORMAL || types[id] == USER_DEFINED) {
        for (at, _) in t.char_indices().skip(1) {
            let (a, b) = t.split_at(at);
            if vocab.contains_key(a) && vocab.contains_key(b) {
                ranked.push((scores[id], id, a.to_owned(), b.to_owned()));
            }
        }
    }
    ranked.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)));
    let byte_token = |b: usize| vocab.contains_key(&format!("<0x{b:02X}>")) || (b < 0x80 && vocab.contains_key(&(b as u8 as char).to_string()));
    let unencodable = std::array::from_fn(|b| !byte_token(b));
    let merges = ranked.into_iter().map(|(_, _, a, b)| (a, b)).collect();
    let bpe = BPE::builder().vocab_and_merges(vocab, merges).byte_fallback(true).build().map_err(tk("building the SentencePiece model"))?;
    let mut inner = tokenizers::Tokenizer::new(bpe);
    let mut norm: Vec<NormalizerWrapper> = vec![Replace::new(" ", "▁").map_err(tk("the space replacement"))?.into()];
    if space_prefix {
        norm.push(Prepend::new("▁".into()).into());
    }
    inner.with_normalizer(Some(NormalizerSequence::new(norm))).map_err(tk("the normalizer"))?;
    let decoders = vec![Replace::new("▁", " ").map_err(tk("the space replacement"))?.into(), ByteFallback::new().into(), Fuse::new().into()];
    inner.with_decoder(Some(DecoderSequence::new(decoders)));
    Ok((inner, unencodable))
}

impl Tokenizer {
    pub fn from_gguf(g: &Gguf) -> Result<Tokenizer> {
        Self::from_metadata(&g.metadata)
    }

    fn from_metadata(meta: &[(String, Value)]) -> Result<Tokenizer> {
        let spm = match string(meta, "tokenizer.ggml.model")? {
            "gpt2" => false,
            "llama" => true,
            other => return Err(Invalid(format!("tokenizer.ggml.model `{other}` is not supported (`gpt2`: byte-level BPE; `llama`: SentencePiece BPE)"))),
        };
        let tokens: Vec<String> = strings(meta, "tokenizer.ggml.tokens")?.into_iter().map(str::to_owned).collect();
        let n = tokens.len();
        let types = array(meta, "tokenizer.ggml.token_type")?;
        if types.len() != n {
            return Err(Invalid(format!("tokenizer.ggml.token_type has {} entries for {n} tokens", types.len())));
        }
        let types = types.iter().enumerate().map(|(i, v)| v.as_u64().ok_or_else(|| Invalid(format!("tokenizer.ggml.token_type[{i}] is {v:?}"))));
        let types = types.collect::<Result<Vec<u64>>>()?;
        let bos = required_id(meta, "tokenizer.ggml.bos_token_id", n)?;
        let eos = required_id(meta, "tokenizer.ggml.eos_token_id", n)?;
        let pad = token_id(meta, "tokenizer.ggml.padding_token_id", n)?;
        let flag = |key: &str, default: bool| match get(meta, key) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => Err(Invalid(format!("{key} is {v:?}, not a bool"))),
        };
        // llama.cpp's defaults: SentencePiece vocabularies add BOS and a leading space.
        let add_bos = flag("tokenizer.ggml.add_bos_token", spm)?;
        let mut vocab = Vocab::with_capacity(n);
        for (i, t) in tokens.iter().enumerate() {
            if let Some(first) = vocab.insert(t.clone(), i as u32) {
                return Err(Invalid(format!("tokenizer.ggml.tokens has `{t}` twice (ids {first} and {i})")));
            }
        }
        let (mut inner, unencodable, strip_space) = if spm {
            let space_prefix = flag("tokenizer.ggml.add_space_prefix", true)?;
            let (inner, unencodable) = sentencepiece(meta, &tokens, &types, vocab, space_prefix)?;
            (inner, unencodable, space_prefix)
        } else {
            let (pre, ignore_merges) = pre_tokenizer(string(meta, "tokenizer.ggml.pre")?)?;
            let merges = strings(meta, "tokenizer.ggml.merges")?.into_iter().enumerate();
            let merges = merges.map(|(i, m)| {
                // Byte-level symbols never contain a space (it is `Ġ`), so the first space separates the pair.
                m.split_once(' ').map(|(a, b)| (a.to_owned(), b.to_owned())).ok_or_else(|| Invalid(format!("tokenizer.ggml.merges[{i}] `{m}` is not two symbols")))
            });
            let merges = merges.collect::<Result<Vec<_>>>()?;
            let unencodable = byte_symbols().map(|c| !vocab.contains_key(&c.to_string()));
            let bpe = BPE::builder().vocab_and_merges(vocab, merges).ignore_merges(ignore_merges).build().map_err(tk("building the BPE model"))?;
            let mut inner = tokenizers::Tokenizer::new(bpe);
            inner.with_pre_tokenizer(Some(pre));
            inner.with_decoder(Some(ByteLevel::default()));
            (inner, unencodable, false)
        };
        // Control and user-defined tokens are matched whole in the raw text before anything else,
        // so "<|im_start|>" is one id rather than the pieces of its characters.
        let added = tokens.iter().zip(&types).filter(|(_, &ty)| ty == CONTROL || ty == USER_DEFINED);
        inner.add_tokens(added.map(|(t, &ty)| AddedToken::from(t.clone(), ty == CONTROL).normalized(false))).map_err(tk("adding control tokens"))?;

        let mut eog = vec![eos];
        eog.extend(token_id(meta, "tokenizer.ggml.eot_token_id", n)?);
        // ChatML closes every turn with <|im_end|>; llama.cpp also stops on it.
        let chatml = get(meta, "tokenizer.chat_template").and_then(Value::as_str).is_some_and(|t| t.contains("<|im_start|>"));
        let im_end = tokens.iter().position(|t| t == "<|im_end|>").filter(|&i| types[i] == CONTROL);
        eog.extend(im_end.filter(|_| chatml).map(|i| i as u32));
        eog.sort_unstable();
        eog.dedup();
        Ok(Tokenizer { inner, tokens, bos, eos, pad, add_bos, eog, unencodable, strip_space })
    }

    /// Token ids of `text`; control tokens written in the text become their ids. `add_special`
    /// prepends BOS when the model asks for it (`tokenizer.ggml.add_bos_token`).
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        if let Some(at) = text.bytes().position(|b| self.unencodable[b as usize]) {
            return Err(Invalid(format!("text byte {at} (0x{:02x}) has no symbol in the vocabulary", text.as_bytes()[at])));
        }
        let enc = self.inner.encode_fast(text, false).map_err(tk("encoding"))?;
        let mut ids = Vec::with_capacity(enc.len() + 1);
        if add_special && self.add_bos {
            ids.push(self.bos);
        }
        ids.extend_from_slice(enc.get_ids());
        Ok(ids)
    }

    /// The text of `ids`, control tokens included; bytes that do not form UTF-8 become U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        ids.iter().try_for_each(|&id| check_id(id, self.tokens.len()))?;
        let text = self.inner.decode(ids, false).map_err(tk("decoding"))?;
        Ok(match text.strip_prefix(' ') {
            Some(rest) if self.strip_space => rest.to_owned(),
            _ => text,
        })
    }

    /// A decoder for ids that arrive one at a time, as in generation.
    pub fn stream(&self) -> TextStream<'_> {
        TextStream { vocab_size: self.tokens.len(), inner: self.inner.decode_stream(false) }
    }

    /// Whether the model asks for BOS before a text (`tokenizer.ggml.add_bos_token`).
    pub fn adds_bos(&self) -> bool {
        self.add_bos
    }
    pub fn bos(&self) -> u32 {
        self.bos
    }
    pub fn eos(&self) -> u32 {
        self.eos
    }
    pub fn pad(&self) -> Option<u32> {
        self.pad
    }
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }
    /// The token's string as stored in the vocabulary (byte-level symbols: a space is `Ġ`).
    pub fn token(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }
    /// Whether generation stops at `id`: EOS, EOT, and <|im_end|> for ChatML templates.
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }
}

fn check_id(id: u32, vocab_size: usize) -> Result<()> {
    if (id as usize) < vocab_size {
        Ok(())
    } else {
        Err(Invalid(format!("token id {id} is outside the vocabulary ({vocab_size} tokens)")))
    }
}

impl TextStream<'_> {
    /// Adds one id; returns the text it completes, or `None` while a character is still partial.
    pub fn step(&mut self, id: u32) -> Result<Option<String>> {
        check_id(id, self.vocab_size)?;
        self.inner.step(id).map_err(tk("decoding a stream"))
    }
}

impl ChatTemplate {
    /// The template in `tokenizer.chat_template`, or `None` when the file has none.
    pub fn from_gguf(g: &Gguf) -> Result<Option<ChatTemplate>> {
        Self::from_metadata(&g.metadata)
    }

    fn from_metadata(meta: &[(String, Value)]) -> Result<Option<ChatTemplate>> {
        if get(meta, "tokenizer.chat_template").is_none() {
            return Ok(None);
        }
        let source = string(meta, "tokenizer.chat_template")?;
        let tokens = strings(meta, "tokenizer.ggml.tokens")?;
        let text = |key| required_id(meta, key, tokens.len()).map(|id| tokens[id as usize].to_owned());
        let (bos, eos) = (text("tokenizer.ggml.bos_token_id")?, text("tokenizer.ggml.eos_token_id")?);
        let mut env = Environment::new();
        // transformers renders chat templates with trim_blocks and lstrip_blocks.
        let syntax = minijinja::syntax::SyntaxConfig::builder().trim_blocks(true).lstrip_blocks(true).build();
        env.set_syntax(syntax.map_err(|e| Invalid(format!("chat template syntax: {e}")))?);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> std::result::Result<String, minijinja::Error> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_template_owned("chat", source.to_owned()).map_err(|e| Invalid(format!("tokenizer.chat_template does not parse: {e}")))?;
        Ok(Some(ChatTemplate { env, bos, eos }))
    }

    /// The prompt for `messages` as (role, content) pairs; `add_generation_prompt` opens the
    /// assistant's turn.
    pub fn render(&self, messages: &[(&str, &str)], add_generation_prompt: bool) -> Result<String> {
        let messages: Vec<minijinja::Value> = messages.iter().map(|&(role, content)| context! { role, content }).collect();
        let ctx = context! { messages, add_generation_prompt, bos_token => &self.bos, eos_token => &self.eos };
        let template = self.env.get_template("chat").map_err(|e| Invalid(format!("chat template: {e}")))?;
        template.render(ctx).map_err(|e| Invalid(format!("chat template: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{{ bos_token }}{% if messages[0].role != 'system' %}{{ raise_exception('a system message comes first') }}{% endif %}\
        {% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content.strip() }}<|im_end|>\n{% endfor %}\
        {% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

    /// The 256 byte symbols, a few merged tokens (one joining two digits), two control tokens and
    /// a user-defined one.
    fn tokens() -> Vec<String> {
        let mut bytes: Vec<char> = ByteLevel::alphabet().into_iter().collect();
        bytes.sort_unstable();
        let mut tokens: Vec<String> = bytes.iter().map(char::to_string).collect();
        tokens.extend(["he", "ll", "hell", "hello", "20", "<|im_start|>", "<|im_end|>", "<tool>"].map(String::from));
        tokens
    }

    fn metadata(tokens: &[String]) -> Vec<(String, Value)> {
        let merges = ["h e", "l l", "he ll", "hell o", "2 0"];
        let types = tokens.iter().map(|t| match t.as_str() {
            "<|im_start|>" | "<|im_end|>" => 3,
            "<tool>" => 4,
            _ => 1,
        });
        let id = |s: &str| Value::U32(tokens.iter().position(|t| t == s).unwrap() as u32);
        let list = |v: &[&str]| Value::Array(v.iter().map(|s| Value::String(s.to_string())).collect());
        vec![
            ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
            ("tokenizer.ggml.pre".into(), Value::String("smollm".into())),
            ("tokenizer.ggml.tokens".into(), list(&tokens.iter().map(String::as_str).collect::<Vec<_>>())),
            ("tokenizer.ggml.merges".into(), list(&merges)),
            ("tokenizer.ggml.token_type".into(), Value::Array(types.map(Value::I32).collect())),
            ("tokenizer.ggml.bos_token_id".into(), id("<|im_start|>")),
            ("tokenizer.ggml.eos_token_id".into(), id("<|im_end|>")),
            ("tokenizer.chat_template".into(), Value::String(CHATML.into())),
        ]
    }

    fn vocab() -> (Vec<String>, Vec<(String, Value)>) {
        let tokens = tokens();
        let meta = metadata(&tokens);
        (tokens, meta)
    }

    fn ids(tokens: &[String], pieces: &[&str]) -> Vec<u32> {
        pieces.iter().map(|p| tokens.iter().position(|t| t == p).unwrap_or_else(|| panic!("{p} not in the vocabulary")) as u32).collect()
    }

    fn set(meta: &mut Vec<(String, Value)>, key: &str, v: Value) {
        meta.retain(|(k, _)| k != key);
        meta.push((key.into(), v));
    }

    #[test]
    fn encodes_through_the_merges_and_decodes_back() {
        let (tokens, meta) = vocab();
        let t = Tokenizer::from_metadata(&meta).unwrap();
        let text = "hello hello<tool>";
        let got = t.encode(text, true).unwrap();
        assert_eq!(got, ids(&tokens, &["hello", "Ġ", "hello", "<tool>"]), "add_bos_token is absent: no BOS");
        assert_eq!(t.decode(&got).unwrap(), text);
        assert!(t.decode(&[tokens.len() as u32]).unwrap_err().to_string().contains("outside the vocabulary"));
    }

    #[test]
    fn byte_symbols_are_the_byte_level_alphabet() {
        let ours: std::collections::HashSet<char> = byte_symbols().into_iter().collect();
        assert_eq!(ours, ByteLevel::alphabet().into_iter().collect());
        assert_eq!((byte_symbols()[b' ' as usize], byte_symbols()[b'\n' as usize], byte_symbols()[4]), ('Ġ', 'Ċ', 'Ą'));
    }

    #[test]
    fn a_byte_without_a_symbol_is_refused_not_dropped() {
        let mut tokens = tokens();
        // Byte 0x04's symbol, renamed: the vocabulary keeps its size but cannot spell the byte.
        let at = tokens.iter().position(|t| t == "Ą").unwrap();
        tokens[at] = "ĄĄ".into();
        let meta = metadata(&tokens);
        let t = Tokenizer::from_metadata(&meta).unwrap();
        let e = t.encode("he\u{4}", false).unwrap_err().to_string();
        assert!(e.contains("byte 2 (0x04)"), "{e}");
        assert!(t.encode("he\u{5}", false).is_ok());
    }

    #[test]
    fn digits_are_split_even_when_the_vocabulary_joins_them() {
        let (tokens, meta) = vocab();
        let t = Tokenizer::from_metadata(&meta).unwrap();
        assert_eq!(t.encode("2026 he", false).unwrap(), ids(&tokens, &["2", "0", "2", "6", "Ġ", "he"]));
    }

    #[test]
    fn llama_bpe_groups_digits_by_three_and_takes_whole_words_from_the_vocabulary() {
        let (mut tokens, _) = vocab();
        // "hel" is a token no merge reaches: only Llama 3's ignore_merges finds it.
        tokens.push("hel".into());
        let mut meta = metadata(&tokens);
        let smollm = Tokenizer::from_metadata(&meta).unwrap();
        set(&mut meta, "tokenizer.ggml.pre", Value::String("llama-bpe".into()));
        let llama3 = Tokenizer::from_metadata(&meta).unwrap();
        assert_eq!(llama3.encode("hel 2026", false).unwrap(), ids(&tokens, &["hel", "Ġ", "20", "2", "6"]));
        assert_eq!(smollm.encode("hel 2026", false).unwrap(), ids(&tokens, &["he", "l", "Ġ", "2", "0", "2", "6"]));
    }

    #[test]
    fn control_tokens_are_one_id_and_end_generation() {
        let (tokens, mut meta) = vocab();
        set(&mut meta, "tokenizer.ggml.add_bos_token", Value::Bool(true));
        let t = Tokenizer::from_metadata(&meta).unwrap();
        let want = ids(&tokens, &["<|im_start|>", "<|im_start|>", "hello", "<|im_end|>"]);
        assert_eq!(t.encode("<|im_start|>hello<|im_end|>", true).unwrap(), want);
        assert_eq!(t.bos(), want[0]);
        assert!(t.is_eog(want[3]) && !t.is_eog(want[2]));
        assert_eq!(t.token(want[2]), Some("hello"));
    }

    #[test]
    fn stream_holds_back_a_split_character() {
        let (tokens, meta) = vocab();
        let t = Tokenizer::from_metadata(&meta).unwrap();
        // "é" is the bytes C3 A9, two byte-level tokens.
        let e = t.encode("é", false).unwrap();
        assert_eq!(e, ids(&tokens, &["Ã", "©"]));
        let mut s = t.stream();
        assert_eq!(s.step(e[0]).unwrap(), None);
        assert_eq!(s.step(e[1]).unwrap().as_deref(), Some("é"));
    }

    #[test]
    fn refuses_unknown_model_and_pre_naming_them() {
        let (_, mut meta) = vocab();
        set(&mut meta, "tokenizer.ggml.pre", Value::String("qwen2".into()));
        let e = Tokenizer::from_metadata(&meta).err().unwrap().to_string();
        assert!(e.contains("`qwen2`") && e.contains("smollm, llama-bpe"), "{e}");
        set(&mut meta, "tokenizer.ggml.model", Value::String("bert".into()));
        let e = Tokenizer::from_metadata(&meta).err().unwrap().to_string();
        assert!(e.contains("`bert`"), "{e}");
        // A SentencePiece vocabulary needs its scores.
        set(&mut meta, "tokenizer.ggml.model", Value::String("llama".into()));
        let e = Tokenizer::from_metadata(&meta).err().unwrap().to_string();
        assert!(e.contains("tokenizer.ggml.scores"), "{e}");
    }

    #[test]
    fn a_missing_key_is_named() {
        let (_, mut meta) = vocab();
        meta.retain(|(k, _)| k != "tokenizer.ggml.merges");
        let e = Tokenizer::from_metadata(&meta).err().unwrap().to_string();
        assert!(e.contains("tokenizer.ggml.merges"), "{e}");
    }

    #[test]
    fn chat_template_renders_with_python_methods_and_raises() {
        let (_, meta) = vocab();
        let c = ChatTemplate::from_metadata(&meta).unwrap().unwrap();
        let got = c.render(&[("system", "Be brief."), ("user", "  Hi \n")], true).unwrap();
        assert_eq!(got, "<|im_start|><|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
        let e = c.render(&[("user", "Hi")], false).unwrap_err().to_string();
        assert!(e.contains("a system message comes first"), "{e}");
    }
}
