package broker

// FixedStoreID is a StoreID named id with no store behind it: a broker
// that takes its store for another one.
func FixedStoreID(id string) *StoreID { return fixedStoreID(id) }

// RereadEvery is how often a StoreID reads its store's id again at most.
const RereadEvery = rereadEvery
