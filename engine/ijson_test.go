package engine_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ratchet-run/ratchet/engine"
)

func TestInputThatDecodersMayReadDifferentlyIsRefusedBeforeAnyWrite(t *testing.T) {
	t.Parallel()
	b := setup(t)
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "any", func(context.Context, map[string]any) (int, error) { return 1, nil }, nil)
	require.NoError(t, err)
	registerCharge(t, workflows, nil)
	c := b.client(t, workflows, nil)
	n := 0
	start := func(workflow, input string) error {
		n++
		_, err := c.Start(context.Background(), engine.StartParams{Workflow: workflow, IdempotencyKey: fmt.Sprint("k", n), Input: []byte(input)})
		return err
	}
	for _, input := range []string{
		"{\"customer\": \"cus_\xff\xfe\"}",               // not UTF-8: would decode as U+FFFD
		`{"customer": "cus_\ud800"}`,                     // a lone high surrogate
		`{"customer": "cus_\udc00x"}`,                    // a lone low surrogate
		`{"customer": "\ud800\u0041"}`,                   // a high surrogate and no low one
		`{"amount": 1, "customer": "a", "amount": 4321}`, // a name twice
		`{"x": {"a": 1, "b": 2, "\u0061": 3}}`,           // twice, once escaped, nested
		`null`,                                           // nothing, for a struct input
	} {
		require.ErrorIs(t, start("charge", input), engine.ErrInvalidInput, "%q", input)
	}
	for _, input := range []string{
		`{"customer": "cus_\ud83d\ude00"}`,           // a surrogate pair
		`{"customer": "back\\ud800slash"}`,           // an escaped backslash, then text
		`{"a": {"b": 1}, "b": [{"a": 1}, {"a": 2}]}`, // the same names in different objects
	} {
		require.NoError(t, start("any", input), "%q", input)
	}
	require.NoError(t, start("any", `null`), "a map takes null")
	require.Equal(t, 4, b.countRows(t, "runs"), "the refused inputs wrote nothing")
}
