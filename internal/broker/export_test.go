package broker

// FixedStoreID is a StoreID named id with no store behind it: a broker
// that takes its store for another one.
func FixedStoreID(id string) *StoreID { return fixedStoreID(id) }
