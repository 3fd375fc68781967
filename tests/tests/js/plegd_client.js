// A Node client of plegd with @grpc/grpc-js's defaults on the unix socket: prints "listed N",
// "healthy", then, from a Watch started after the listing, "died <exit code>" once the
// container given dies.
//
// usage: node plegd_client.js <socket> <proto dir> <well-known proto dir> <container id>
const grpc = require('@grpc/grpc-js');
const loader = require('@grpc/proto-loader');

const [socket, protos, wellKnown, container] = process.argv.slice(2);
const definition = loader.loadSync('plegd/v1/plegd.proto', {
  includeDirs: [protos, wellKnown],
  keepCase: true,
  longs: String,
  enums: String,
  defaults: true,
});
const { Pleg } = grpc.loadPackageDefinition(definition).plegd.v1;
const pleg = new Pleg(`unix:${socket}`, grpc.credentials.createInsecure());

const fail = (what, error) => {
  console.error(`${what}: ${error}`);
  process.exit(1);
};

pleg.ListPods({}, (error, listing) => {
  if (error) fail('ListPods', error);
  console.log(`listed ${listing.pods.length}`);
  pleg.GetHealth({}, (error, health) => {
    if (error) fail('GetHealth', error);
    if (health.healthy) console.log('healthy');
    const events = pleg.Watch({
      from_sequence: String(BigInt(listing.sequence) + 1n),
      run_id: listing.run_id,
    });
    events.on('data', (event) => {
      if (event.type === 'CONTAINER_DIED' && event.container_id === container) {
        console.log(`died ${event.exit_code}`);
        events.cancel();
        process.exit(0);
      }
    });
    events.on('error', (error) => fail('Watch', error));
    console.log('watching');
  });
});
