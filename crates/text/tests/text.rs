//! The text layer on the hand-made byte-level BPE fixture (`tests/fixtures/chatml-bpe`,
//! written by its `make.py`): SmolLM2-Instruct's shape at toy size.

use std::path::{Path, PathBuf};

use solder_text::{
    ChatTemplate, GenerationConfig, Message, StopConditions, StopReason, TextError, TextStream,
    Tokenizer, TokenizerConfig,
};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chatml-bpe")
}

fn tokenizer() -> Tokenizer {
    Tokenizer::from_dir(&fixture()).unwrap()
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir()
        .join(format!("solder-text-{}", std::process::id()))
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The id of a token given by its byte-level spelling.
fn id(t: &Tokenizer, token: &str) -> u32 {
    t.token_to_id(token)
        .unwrap_or_else(|| panic!("{token} not in the fixture"))
}

#[test]
fn merges_apply_and_specials_resolve() {
    let t = tokenizer();
    assert_eq!(t.id_limit(), 288);
    assert_eq!(
        t.encode("hello world", false).unwrap(),
        [id(&t, "hello"), id(&t, "Ġworld")]
    );
    // The post-processor prepends <|begin_of_text|> only with special tokens on.
    let bos = t.bos_id().unwrap();
    assert_eq!(bos, id(&t, "<|begin_of_text|>"));
    assert_eq!(t.encode("hello", true).unwrap(), [bos, id(&t, "hello")]);
    // eos_token is written as an {"content": ..} object.
    assert_eq!(t.eos_id(), Some(id(&t, "<|im_end|>")));
    // Special tokens in text are matched whole.
    assert_eq!(
        t.encode("<|im_start|>user", false).unwrap(),
        [id(&t, "<|im_start|>"), id(&t, "user")]
    );
    let ids = t.encode("café 😀!", false).unwrap();
    assert_eq!(t.decode(&ids, false).unwrap(), "café 😀!");
    // U+1F600 is two tokens of two bytes each.
    assert!(
        ids.contains(&id(&t, "ðŁ")) && ids.contains(&id(&t, "ĺĢ")),
        "{ids:?}"
    );
    assert_eq!(t.decode(&[bos, id(&t, "hello")], true).unwrap(), "hello");
    assert_eq!(
        t.decode(&[bos, id(&t, "hello")], false).unwrap(),
        "<|begin_of_text|>hello"
    );
}

#[test]
fn a_folder_without_tokenizer_json_is_refused_by_path() {
    let dir = scratch("empty");
    let e = Tokenizer::from_dir(&dir).unwrap_err();
    assert!(matches!(e, TextError::NoTokenizer { .. }));
    let message = e.to_string();
    assert!(
        message.contains("text was asked for but")
            && message.contains(&dir.display().to_string())
            && message.contains("has no tokenizer.json"),
        "{message}"
    );
}

#[test]
fn a_broken_tokenizer_or_unknown_special_is_named() {
    let dir = scratch("broken");
    std::fs::write(dir.join("tokenizer.json"), "{\"model\": 3}").unwrap();
    let e = Tokenizer::from_dir(&dir).unwrap_err().to_string();
    assert!(e.contains("tokenizer.json"), "{e}");
    std::fs::copy(fixture().join("tokenizer.json"), dir.join("tokenizer.json")).unwrap();
    std::fs::write(
        dir.join("tokenizer_config.json"),
        r#"{"bos_token": "<nope>"}"#,
    )
    .unwrap();
    let e = Tokenizer::from_dir(&dir).unwrap_err().to_string();
    assert!(
        e.contains("tokenizer_config.json") && e.contains("bos_token") && e.contains("<nope>"),
        "{e}"
    );
}

#[test]
fn smollm2_chatml_renders_as_transformers_does() {
    let template = ChatTemplate::from_dir(&fixture()).unwrap();
    let user = [Message::new("user", "hello")];
    assert_eq!(
        template.render(&user, true).unwrap(),
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging \
         Face<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    );
    let with_system = [
        Message::new("system", "Be brief."),
        Message::new("user", "hi"),
    ];
    assert_eq!(
        template.render(&with_system, false).unwrap(),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
    );
    // A rendered chat encodes without the post-processor's BOS: the specials are whole.
    let t = tokenizer();
    let ids = t
        .encode(&template.render(&user, true).unwrap(), false)
        .unwrap();
    assert_eq!(ids[0], id(&t, "<|im_start|>"));
    assert_eq!(
        ids.iter().filter(|&&i| i == id(&t, "<|im_end|>")).count(),
        2
    );
}

/// Whitespace control, context and the functions templates call, each as transformers
/// renders them (its environment: trim_blocks, lstrip_blocks, no trailing newline kept).
#[test]
fn templates_see_transformers_environment() {
    let config = TokenizerConfig::from_dir(&fixture()).unwrap();
    let render = |source: &str, messages: &[Message]| {
        ChatTemplate::new(source.to_string(), "inline.jinja".into(), &config)
            .and_then(|t| t.render(messages, true))
    };
    let hi = [Message::new("user", "  hi  ")];
    // trim_blocks drops the newline after a block tag, lstrip_blocks the indent before it,
    // and the template's own final newline goes.
    let source = "{% for m in messages %}\n    {% if m.role == 'user' %}\n[{{ m.content.strip() }}]\n    {% endif %}\n{% endfor %}\n";
    assert_eq!(render(source, &hi).unwrap(), "[hi]\n");
    assert_eq!(
        render(
            "{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}",
            &hi
        )
        .unwrap(),
        "<|begin_of_text|>|<|im_end|>|True"
    );
    assert_eq!(
        render("{{ messages | tojson }}", &hi).unwrap(),
        r#"[{"role": "user", "content": "  hi  "}]"#
    );
    assert_eq!(
        render("{% for m in messages %}{% if m.role == 'user' %}{% break %}{% endif %}x{% endfor %}{{ 'a,b'.split(',') | join('+') }}{{ messages[0]['content'].startswith('  h') }}", &hi).unwrap(),
        "a+bTrue"
    );
    assert_eq!(
        render("{% macro turn(m) %}<{{ m.role }}>{% endmacro %}{% for m in messages %}{{ turn(m) }}{% endfor %}", &hi).unwrap(),
        "<user>"
    );
    let date = render("{{ strftime_now('%Y') }}", &hi).unwrap();
    assert!(date.len() == 4 && date.starts_with('2'), "{date}");
    let e = render(
        "{% if messages[0].role != 'system' %}{{ raise_exception('System first!') }}{% endif %}",
        &hi,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("inline.jinja") && e.contains("System first!"),
        "{e}"
    );
    let e = render("{% for %}", &hi).unwrap_err().to_string();
    assert!(e.contains("inline.jinja"), "{e}");
}

#[test]
fn chat_template_sources_follow_transformers_priority() {
    let dir = scratch("templates");
    std::fs::copy(fixture().join("tokenizer.json"), dir.join("tokenizer.json")).unwrap();
    let e = ChatTemplate::from_dir(&dir).unwrap_err();
    assert!(matches!(e, TextError::NoChatTemplate { .. }), "{e}");
    std::fs::write(
        dir.join("tokenizer_config.json"),
        r#"{"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D{{ messages|length }}"}]}"#,
    )
    .unwrap();
    let one = [Message::new("user", "x")];
    assert_eq!(
        ChatTemplate::from_dir(&dir)
            .unwrap()
            .render(&one, false)
            .unwrap(),
        "D1"
    );
    // A chat_template.jinja beside it takes priority.
    std::fs::write(
        dir.join("chat_template.jinja"),
        "J{{ messages[0].content }}\n",
    )
    .unwrap();
    let template = ChatTemplate::from_dir(&dir).unwrap();
    assert_eq!(template.render(&one, false).unwrap(), "Jx");
    assert!(template.path().ends_with("chat_template.jinja"));
    std::fs::remove_file(dir.join("chat_template.jinja")).unwrap();
    std::fs::write(
        dir.join("tokenizer_config.json"),
        r#"{"chat_template": [{"name": "tool_use", "template": "T"}]}"#,
    )
    .unwrap();
    let e = ChatTemplate::from_dir(&dir).unwrap_err().to_string();
    assert!(
        e.contains("tokenizer_config.json")
            && e.contains("chat_template")
            && e.contains("tool_use"),
        "{e}"
    );
}

#[test]
fn the_fixture_generation_config_names_im_end() {
    let config = GenerationConfig::from_dir(&fixture()).unwrap();
    let t = tokenizer();
    assert_eq!(config.eos_token_ids, [id(&t, "<|im_end|>")]);
    assert_eq!(config.sampling(), None);
}

/// Pushes `ids` one at a time; the texts each push emitted and how the stream ended.
fn stream_all(
    t: &Tokenizer,
    prompt: &[u32],
    ids: &[u32],
    conditions: StopConditions,
) -> (Vec<String>, Option<StopReason>, String) {
    let mut stream = TextStream::new(t, prompt, conditions).unwrap();
    let mut pieces = Vec::new();
    for &id in ids {
        let step = stream.push(id).unwrap();
        pieces.push(step.text);
        if step.stop.is_some() {
            return (pieces, step.stop, stream.text().to_string());
        }
    }
    let end = stream.finish(StopReason::Length).unwrap();
    pieces.push(end.text);
    (pieces, end.stop, stream.text().to_string())
}

#[test]
fn a_stream_never_emits_half_a_character() {
    let t = tokenizer();
    let prompt = t.encode("<|im_start|>assistant\n", false).unwrap();
    let text = "hello 😀 café é😀é";
    let ids = t.encode(text, false).unwrap();
    let (pieces, stop, all) = stream_all(&t, &prompt, &ids, StopConditions::default());
    assert_eq!(stop, Some(StopReason::Length));
    assert_eq!(all, text);
    assert_eq!(pieces.concat(), text);
    assert!(pieces.iter().all(|p| !p.contains('\u{fffd}')), "{pieces:?}");
    // The emoji's first token emits nothing; its second emits the whole character.
    let first_half = ids.iter().position(|&i| i == id(&t, "ðŁ")).unwrap();
    assert_eq!(pieces[first_half], "");
    assert_eq!(pieces[first_half + 1], "😀");
    // A sequence cut mid-character shows the partial bytes only when it ends.
    let (pieces, _, all) = stream_all(&t, &prompt, &ids[..=first_half], StopConditions::default());
    assert!(pieces[..first_half + 1]
        .iter()
        .all(|p| !p.contains('\u{fffd}')));
    assert!(all.ends_with('\u{fffd}'), "{all:?}");
}

#[test]
fn eos_stops_without_its_text_and_releases_held_text() {
    let t = tokenizer();
    let eos = t.eos_id().unwrap();
    let mut ids = t.encode("hello ST", false).unwrap();
    ids.push(eos);
    ids.extend(t.encode(" world", false).unwrap());
    let conditions = StopConditions {
        eos_ids: vec![eos],
        stop_strings: vec![" STOP".into()],
    };
    let (pieces, stop, all) = stream_all(&t, &[], &ids, conditions.clone());
    assert_eq!(stop, Some(StopReason::Eos));
    assert_eq!(all, "hello ST");
    // " ST" was held back as a possible start of " STOP" until EOS released it.
    assert_eq!(pieces.last().unwrap(), " ST");
    // No token after a stop.
    let mut stream = TextStream::new(&t, &[], conditions).unwrap();
    stream.push(eos).unwrap();
    let e = stream.push(ids[0]).unwrap_err().to_string();
    assert!(e.contains("already stopped") && e.contains("eos"), "{e}");
}

#[test]
fn a_stop_string_ends_the_text_before_it() {
    let t = tokenizer();
    let ids = t.encode("hello STOP world", false).unwrap();
    let conditions = StopConditions {
        eos_ids: Vec::new(),
        stop_strings: vec!["STOP".into(), "zzz".into()],
    };
    let (pieces, stop, all) = stream_all(&t, &[], &ids, conditions);
    assert_eq!(stop, Some(StopReason::Stop));
    assert_eq!(all, "hello ");
    assert!(!pieces.concat().contains("ST"));
    // A stop string made of a character's halves matches once the character is whole.
    let ids = t.encode("café😀 more", false).unwrap();
    let conditions = StopConditions {
        eos_ids: Vec::new(),
        stop_strings: vec!["😀".into()],
    };
    let (_, stop, all) = stream_all(&t, &[], &ids, conditions);
    assert_eq!((stop, all.as_str()), (Some(StopReason::Stop), "café"));
    let e = TextStream::new(
        &t,
        &[],
        StopConditions {
            eos_ids: Vec::new(),
            stop_strings: vec!["a".into(), String::new()],
        },
    )
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("stop string 1") && e.contains("empty"), "{e}");
}
