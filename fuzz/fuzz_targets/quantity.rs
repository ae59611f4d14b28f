#![no_main]
//! Any text as a quantity: parsed, printed, parsed again to the same value.
libfuzzer_sys::fuzz_target!(|text: &[u8]| koord_webhook_fuzz::quantity(text));
