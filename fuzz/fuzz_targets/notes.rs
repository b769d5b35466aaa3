//! Any note text: the front-matter parser returns the runs and the body, or why not (naming the
//! line of a TOML error), and never panics; what it returns, written back as a note, reads the same.
#![no_main]

use lab::report::parse_note;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match parse_note(text) {
        Ok((runs, body)) => {
            let mut front = toml::Table::new();
            front.insert("runs".into(), toml::Value::Array(runs.iter().cloned().map(toml::Value::String).collect()));
            let again = format!("+++\n{front}+++\n{body}\n");
            assert_eq!(parse_note(&again), Ok((runs, body)), "{again:?}");
        }
        Err(why) => {
            if let Some(at) = why.strip_prefix("front matter line ") {
                let line: usize = at.split(':').next().unwrap().parse().unwrap();
                assert!((1..=text.lines().count()).contains(&line), "{why}");
            } else {
                assert!(why.starts_with("no `+++` line"), "{why}");
            }
        }
    }
});
