#![no_main]
// Any body sent to VALIDATE_COLOCATION_PROFILE: decode, chain, response.
libfuzzer_sys::fuzz_target!(|body: &[u8]| {
    koord_webhook_fuzz::review(
        koord_webhook::admission::webhooks::VALIDATE_COLOCATION_PROFILE,
        body,
    )
});
