package engine_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/ratchet-run/ratchet/engine"
)

// A nightly settlement at 02:00 Paris time, declared in code, and an
// hourly report put at run time (as PUT /v1/schedules/{name} does). Each
// tick starts exactly one run, keyed by the schedule and the tick; a
// worker's recoverer calls TickSchedules as ticks fall due.
func ExampleSchedule() {
	ctx := context.Background()
	db := exampleDatabase()
	defer db.Close()
	workflows := engine.NewWorkflows()
	_, err := engine.Register(workflows, "settle", func(ctx context.Context, in struct{ Market string }) (string, error) {
		return "settled " + in.Market, nil
	}, nil)
	if err != nil {
		log.Fatal(err)
	}
	client, err := engine.NewClient(db.Pool, &engine.Config{Workflows: workflows, Schedules: []engine.Schedule{{
		Name: "nightly-settlement", Workflow: "settle", Input: []byte(`{"Market": "eu"}`),
		Cron: "0 2 * * *", TimeZone: "Europe/Paris", CatchUp: engine.CatchUpOne, Overlap: engine.OverlapSkip,
	}}})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Shutdown(ctx)                           //nolint:errcheck
	if err := client.DeclareSchedules(ctx); err != nil { // what a worker does as it starts
		log.Fatal(err)
	}
	hourly, err := client.PutSchedule(ctx, engine.Schedule{Name: "hourly-report", Workflow: "settle", Every: time.Hour, Overlap: engine.OverlapBuffer})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(hourly.Source, hourly.CatchUp, hourly.NextTickAt.Minute(), hourly.NextTickAt.Second())

	var nightly *engine.ScheduleState
	nightly, err = client.GetSchedule(ctx, "", "nightly-settlement")
	if err != nil {
		log.Fatal(err)
	}
	paris, _ := time.LoadLocation("Europe/Paris")
	fmt.Println(nightly.Source, nightly.NextTickAt.In(paris).Format("15:04"), nightly.Paused)

	started, next, err := client.TickSchedules(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(started, next.Equal(hourly.NextTickAt) || next.Equal(nightly.NextTickAt), "nothing due yet")

	if _, err := client.PauseSchedule(ctx, "", "hourly-report", true); err != nil {
		log.Fatal(err)
	}
	res, err := client.TriggerSchedule(ctx, "", "nightly-settlement", "rerun-after-incident-42")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Run.IdempotencyKey, res.Run.Status, string(res.Run.Output))

	if err := client.DeleteSchedule(ctx, "", "hourly-report"); err != nil {
		log.Fatal(err)
	}
	all, err := client.ListSchedules(ctx, "")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(all), all[0].Name)
	// Output:
	// api one 0 0
	// code 02:00 false
	// 0 true nothing due yet
	// schedule/nightly-settlement/trigger/rerun-after-incident-42 succeeded "settled eu"
	// 1 nightly-settlement
}
