// An OpenID Connect provider on loopback for the console's sign-in tests (issue 44): npm `oidc-provider`
// (OpenID Certified), with its development login and consent pages, one confidential client that must use PKCE,
// and the accounts of a JSON file read on every lookup, so a test changes a person's groups while they are signed
// in. Usage: node oidc_provider.mjs CONFIG.json; prints "ready ISSUER" once it listens.
//
// CONFIG: {"port": N, "client_id": ..., "client_secret": ..., "redirect_uri": ..., "accounts": PATH}
// ACCOUNTS (PATH): {"ada": {"email": "ada@example.com", "email_verified": true, "groups": ["ml-team"]}}
import { generateKeyPairSync } from "node:crypto";
import { readFileSync } from "node:fs";
import Provider from "oidc-provider";

const config = JSON.parse(readFileSync(process.argv[2], "utf8"));
const issuer = `http://127.0.0.1:${config.port}`;
const signing = generateKeyPairSync("rsa", { modulusLength: 2048 }).privateKey.export({ format: "jwk" });

function accounts() {
  return JSON.parse(readFileSync(config.accounts, "utf8"));
}

const provider = new Provider(issuer, {
  clients: [
    {
      client_id: config.client_id,
      client_secret: config.client_secret,
      redirect_uris: [config.redirect_uri],
      grant_types: ["authorization_code"],
      response_types: ["code"],
      token_endpoint_auth_method: "client_secret_basic",
    },
  ],
  pkce: { required: () => true },
  jwks: { keys: [{ ...signing, kid: "test-signing-key", use: "sig", alg: "RS256" }] },
  cookies: { keys: ["a test provider's cookie key"] },
  claims: { openid: ["sub"], email: ["email", "email_verified"], groups: ["groups"] },
  scopes: ["openid", "email", "groups"],
  features: { devInteractions: { enabled: true } },
  async findAccount(ctx, sub) {
    const account = accounts()[sub];
    if (!account) return undefined;
    return {
      accountId: sub,
      async claims() {
        const now = accounts()[sub] || {};
        return { sub, email: now.email, email_verified: now.email_verified, groups: now.groups || [] };
      },
    };
  },
});

const server = provider.listen(config.port, "127.0.0.1", () => {
  console.log(`ready ${issuer}`);
});
process.on("SIGTERM", () => server.close(() => process.exit(0)));
