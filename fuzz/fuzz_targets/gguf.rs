//! Any bytes: the GGUF reader returns Ok or Err, never panics or reads out of bounds, and an Ok
//! file's data slices have the sizes its tensor infos say.
#![no_main]

#[path = "../../lab/src/weights/gguf.rs"]
#[allow(dead_code)]
mod gguf;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(g) = gguf::Gguf::parse(data) {
        for t in &g.tensors {
            assert_eq!(g.data(t).len() as u64, t.size);
        }
    }
});
