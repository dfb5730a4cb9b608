// Package fakes holds stand-ins for the services a payment workflow calls:
// a payment gateway that deduplicates on Idempotency-Key the way Stripe's
// API does, with faults that can be injected. They run in-process (as an
// http.Handler under httptest) in unit tests and as their own process
// ("ratchet fakes") in crash tests and demos.
package fakes
