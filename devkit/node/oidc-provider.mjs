// An OpenID Connect provider for the tests: oauth2-mock-server (npm), which signs real RS256
// tokens and serves discovery and JWKS, on a port of the OS's choosing. Each token it issues
// for the client-credentials grant carries the client's id as `sub` (librdkafka's OIDC client
// requires one; a provider such as Keycloak sets it too), and each token request is printed
// as one JSON line on standard error — the grant, the scope, the Authorization header — for
// the test to check what librdkafka sent. The first line is {"event":"listening","url":…}.
import { OAuth2Server } from 'oauth2-mock-server';

const server = new OAuth2Server();
await server.issuer.keys.generate('RS256');
server.service.on('beforeTokenSigning', (token, req) => {
  const authorization = req.headers.authorization ?? '';
  let clientId = req.body.client_id ?? null;
  if (authorization.startsWith('Basic ')) {
    clientId = Buffer.from(authorization.slice(6), 'base64').toString().split(':')[0];
  }
  token.payload.sub = clientId;
  console.error(JSON.stringify({
    event: 'token',
    grant_type: req.body.grant_type,
    scope: req.body.scope ?? null,
    authorization,
  }));
});
await server.start(0, '127.0.0.1');
console.error(JSON.stringify({ event: 'listening', url: server.issuer.url }));
