// Package quickstart is the smallest useful Ratchet workflow: a transfer
// between two accounts in two atomic phases, written as a user of the
// public packages would write it.
//
// The debit and the credit commit in separate transactions. If the process
// dies between them, the run resumes at its recovery point ("debited"): the
// debit is not repeated, the credit happens once.
package quickstart

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ratchet-run/ratchet/engine"
	"github.com/ratchet-run/ratchet/steps"
)

// WorkflowName is the name the transfer workflow is registered under.
const WorkflowName = "transfer"

// TransferInput is the workflow input.
type TransferInput struct {
	From   string `json:"from"`
	To     string `json:"to"`
	Amount int64  `json:"amount"`
}

// TransferOutput is the workflow output.
type TransferOutput struct {
	TransferID  int64 `json:"transfer_id"`
	FromBalance int64 `json:"from_balance"`
	ToBalance   int64 `json:"to_balance"`
}

// ErrInsufficientFunds is wrapped in the permanent error of a transfer the
// source account cannot cover.
var ErrInsufficientFunds = errors.New("insufficient funds")

// Setup creates the example's tables if they do not exist, and opens the
// given accounts with the given balances if they are not open yet.
func Setup(ctx context.Context, pool *pgxpool.Pool, balances map[string]int64) error {
	// One message, so one transaction, under a lock: replicas starting
	// together would otherwise race to create the schema (IF NOT EXISTS
	// does not make concurrent creations safe).
	_, err := pool.Exec(ctx, `
		SELECT pg_advisory_xact_lock(hashtext('quickstart.setup'));
		CREATE SCHEMA IF NOT EXISTS quickstart;
		CREATE TABLE IF NOT EXISTS quickstart.accounts (
			name    text   PRIMARY KEY,
			balance bigint NOT NULL CHECK (balance >= 0)
		);
		CREATE TABLE IF NOT EXISTS quickstart.transfers (
			id          bigserial PRIMARY KEY,
			from_name   text      NOT NULL REFERENCES quickstart.accounts,
			to_name     text      NOT NULL REFERENCES quickstart.accounts,
			amount      bigint    NOT NULL CHECK (amount > 0),
			status      text      NOT NULL
		)`)
	if err != nil {
		return fmt.Errorf("quickstart: create tables: %w", err)
	}
	for name, balance := range balances {
		if _, err := pool.Exec(ctx, `INSERT INTO quickstart.accounts VALUES ($1, $2) ON CONFLICT DO NOTHING`, name, balance); err != nil {
			return fmt.Errorf("quickstart: open account %s: %w", name, err)
		}
	}
	return nil
}

// Register adds the transfer workflow to workflows.
func Register(workflows *engine.Workflows) (*engine.Workflow[TransferInput, TransferOutput], error) {
	return engine.Register(workflows, WorkflowName, transfer, &engine.WorkflowOpts{Retention: engine.RetentionForever})
}

type debit struct {
	TransferID int64 `json:"transfer_id"`
	Balance    int64 `json:"balance"`
}

func transfer(ctx context.Context, in TransferInput) (TransferOutput, error) {
	if in.Amount <= 0 || in.From == "" || in.To == "" || in.From == in.To {
		return TransferOutput{}, steps.Permanent("invalid_transfer", fmt.Errorf("want two different accounts and a positive amount, got %+v", in))
	}
	d, err := engine.Atomic(ctx, "debited", func(ctx context.Context, tx pgx.Tx) (debit, error) {
		var d debit
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM quickstart.accounts WHERE name = $1)`, in.To).Scan(&exists); err != nil {
			return d, err
		}
		if !exists {
			return d, steps.Permanent("unknown_account", fmt.Errorf("no account %q", in.To))
		}
		err := tx.QueryRow(ctx, `
			UPDATE quickstart.accounts SET balance = balance - $2
			WHERE name = $1 AND balance >= $2 RETURNING balance`, in.From, in.Amount).Scan(&d.Balance)
		if errors.Is(err, pgx.ErrNoRows) {
			return d, steps.Permanent("insufficient_funds", fmt.Errorf("%w in %q", ErrInsufficientFunds, in.From))
		}
		if err != nil {
			return d, err
		}
		err = tx.QueryRow(ctx, `
			INSERT INTO quickstart.transfers (from_name, to_name, amount, status)
			VALUES ($1, $2, $3, 'debited') RETURNING id`, in.From, in.To, in.Amount).Scan(&d.TransferID)
		return d, err
	}, nil)
	if err != nil {
		return TransferOutput{}, err
	}
	credited, err := engine.Atomic(ctx, "credited", func(ctx context.Context, tx pgx.Tx) (int64, error) {
		var balance int64
		if err := tx.QueryRow(ctx, `
			UPDATE quickstart.accounts SET balance = balance + $2
			WHERE name = $1 RETURNING balance`, in.To, in.Amount).Scan(&balance); err != nil {
			return 0, err
		}
		_, err := tx.Exec(ctx, `UPDATE quickstart.transfers SET status = 'credited' WHERE id = $1`, d.TransferID)
		return balance, err
	}, nil)
	if err != nil {
		return TransferOutput{}, err
	}
	return TransferOutput{TransferID: d.TransferID, FromBalance: d.Balance, ToBalance: credited}, nil
}
