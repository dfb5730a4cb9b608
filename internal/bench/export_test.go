package bench

// SetBulkSeed lowers the size from which SeedHistory builds indexes after
// the rows, and returns the function that restores it.
func SetBulkSeed(n int) (restore func()) {
	was := bulkSeed
	bulkSeed = n
	return func() { bulkSeed = was }
}
