package api_test

import (
	"fmt"
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestConcurrentIdenticalRequestsExecuteOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	const callers = 200
	var (
		wg        sync.WaitGroup
		mu        sync.Mutex
		statuses  = map[int]int{}
		bodies    = map[string]int{}
		start     = make(chan struct{})
		transport = &http.Transport{MaxIdleConnsPerHost: callers, MaxConnsPerHost: callers}
	)
	defer transport.CloseIdleConnections()
	client := &http.Client{Transport: transport}
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			r, err := b.send(client, http.MethodPost, "/v1/workflows/echo/runs", `{"value":"storm"}`,
				"Content-Type", "application/json", "Idempotency-Key", "storm")
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			statuses[r.status]++
			if r.status == http.StatusCreated {
				bodies[string(r.body)]++
			}
		}()
	}
	close(start)
	wg.Wait()

	t.Logf("statuses: %v", statuses)
	require.EqualValues(t, 1, b.executions.Load(), "exactly one execution")
	require.Equal(t, 1, b.counter(t, "storm"))
	require.Equal(t, callers, statuses[http.StatusCreated]+statuses[http.StatusConflict], "only the stored result or 409: %v", statuses)
	require.Len(t, bodies, 1, "every 201 is the same stored result")
}

func TestPaginationNeitherSkipsNorRepeatsDuringInserts(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var existing []string
	for i := range 40 {
		r := b.start(t, "echo", fmt.Sprint("before-", i), fmt.Sprintf(`{"value":"v%d"}`, i))
		require.Equal(t, http.StatusCreated, r.status)
		existing = append(existing, decode[runJSON](t, r).ID)
	}

	stop := make(chan struct{})
	inserted := make(chan struct{})
	go func() {
		defer close(inserted)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := b.send(http.DefaultClient, http.MethodPost, "/v1/workflows/echo/runs", fmt.Sprintf(`{"value":"d%d"}`, i),
				"Content-Type", "application/json", "Idempotency-Key", fmt.Sprint("during-", i)); err != nil {
				t.Error(err)
				return
			}
		}
	}()

	seen := map[string]int{}
	next := ""
	for pages := 0; ; pages++ {
		path := "/v1/runs?limit=7"
		if next != "" {
			path += "&after=" + next
		}
		page := decode[struct {
			Data []runJSON
			Next *string
		}](t, b.do(t, http.MethodGet, path, ""))
		for _, r := range page.Data {
			seen[r.ID]++
		}
		if page.Next == nil {
			break
		}
		next = *page.Next
		require.Less(t, pages, 100)
	}
	close(stop)
	<-inserted

	for id, n := range seen {
		require.Equal(t, 1, n, "run %s listed %d times", id, n)
	}
	for _, id := range existing {
		require.Equal(t, 1, seen[id], "run %s, present from the start, was skipped", id)
	}
}
